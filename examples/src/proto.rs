//! The example system's messages, servers and clients, generated at build
//! time from `examples/proto/cpt/example/example.proto` (package
//! `cpt.example`) by `build.rs` with `protox` and `tonic-prost-build`: no
//! `protoc` needed.
//!
//! The services are plain tonic: implement [`service_a_server::ServiceA`]
//! and serve [`service_a_server::ServiceAServer`], call through
//! [`service_a_client::ServiceAClient`]; the same for B and C.

#![allow(missing_docs)] // the generated modules document what the .proto does
#![allow(clippy::doc_markdown, clippy::missing_errors_doc)]

include!(concat!(env!("OUT_DIR"), "/cpt.example.rs"));

/// gRPC method paths (what the cpt layers record as endpoints).
pub mod method {
    /// `ServiceA.Run`.
    pub const A_RUN: &str = "/cpt.example.ServiceA/Run";
    /// `ServiceB.B1`.
    pub const B_B1: &str = "/cpt.example.ServiceB/B1";
    /// `ServiceC.C1`.
    pub const C_C1: &str = "/cpt.example.ServiceC/C1";
    /// `ServiceC.Scan` (server streaming).
    pub const C_SCAN: &str = "/cpt.example.ServiceC/Scan";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path constants name the generated services: a renamed service or
    /// package in the .proto fails here, not in a trace.
    #[test]
    fn method_paths_match_the_generated_services() {
        assert_eq!(
            method::A_RUN,
            format!("/{}/Run", service_a_server::SERVICE_NAME)
        );
        assert_eq!(
            method::B_B1,
            format!("/{}/B1", service_b_server::SERVICE_NAME)
        );
        assert_eq!(
            method::C_C1,
            format!("/{}/C1", service_c_server::SERVICE_NAME)
        );
        assert_eq!(
            method::C_SCAN,
            format!("/{}/Scan", service_c_server::SERVICE_NAME)
        );
    }
}
