//! Tower middleware for tonic and http: propagate triggers downstream, return
//! and merge callee critical paths (CPT "Propagation and merging").
#![forbid(unsafe_code)]
