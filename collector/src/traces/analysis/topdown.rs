//! Top-down (placeholder while written).
