//! [`Trigger`]: why a request is traced. Untraced is `Option<Trigger>::None`.

use std::fmt;

/// Why a request is traced.
///
/// There is deliberately no "untraced" variant: an untraced request has no
/// trigger at all (`Option<Trigger>::None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Trigger {
    /// A service's sampler chose the request, or a trusted caller propagated
    /// that decision.
    Sampled,
    /// An operator forced a trace on this request (with a valid credential).
    /// Forced records are left out of aggregate profiles by default.
    Forced,
}

impl Trigger {
    /// `"sampled"` or `"forced"`, as in records and headers.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Sampled => "sampled",
            Trigger::Forced => "forced",
        }
    }

    /// Parse [`Trigger::as_str`]'s form.
    pub fn parse(s: &str) -> Option<Trigger> {
        match s {
            "sampled" => Some(Trigger::Sampled),
            "forced" => Some(Trigger::Forced),
            _ => None,
        }
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
