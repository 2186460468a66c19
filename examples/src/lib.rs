//! The CPT Figure 1 example system (services A, B, C) and the Figure 2 demo.
