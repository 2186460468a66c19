//! Heat map (placeholder while written).
