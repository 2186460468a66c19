//! Reading traces in, one module per format ([`jaeger`], [`zipkin`],
//! [`otlp`], [`nezha`] CSV), each producing the neutral
//! [`Trace`](crate::traces::model::Trace), and the clock-skew repair
//! ([`skew`]) every analysis starts from.
//!
//! What comes after the import (the CRISP walk, the reports) is in
//! [`analysis`](crate::traces::analysis); the model both share is
//! [`model`](crate::traces::model); the pipeline that ties them together
//! (files in, records out) is the parent module, [`crate::traces`].

pub mod jaeger;
pub mod nezha;
pub mod otlp;
pub mod skew;
pub(crate) mod tags;
pub mod zipkin;
