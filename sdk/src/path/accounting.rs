//! [`Accounting`]: the time a path could not explain in detail, by
//! [`Cause`].
//!
//! Every place that stores, sends or sums accounting (the JSON Lines record,
//! the wire codec, the collector's ingest messages, merging, aggregation)
//! loops over [`Cause::ALL`] and names each field with [`Cause::name`] and
//! [`Cause::field_number`], so a new cause is added here, once.

use std::time::Duration;

/// Why time is in [`Accounting`]: one variant per field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// Caller-observed minus callee-reported time, summed over RPCs.
    Network,
    /// Callee-reported minus caller-observed time, summed; clamped away.
    Overcount,
    /// Time in RPCs whose callee returned no usable path.
    BlindSpot,
    /// Waits with no instrumented blocker.
    Unattributed,
    /// Time between a node's creation and its first poll, on the path.
    Queueing,
    /// Time whose frames were folded into parents to fit a size limit.
    Truncated,
    /// Time cut from spans by clock-skew repair of an imported trace.
    ClockSkew,
}

impl Cause {
    /// Every cause, in field-number order.
    pub const ALL: [Cause; 7] = [
        Cause::Network,
        Cause::Overcount,
        Cause::BlindSpot,
        Cause::Unattributed,
        Cause::Queueing,
        Cause::Truncated,
        Cause::ClockSkew,
    ];

    /// The snake-case name: `{name}_ns` is the cause's key in the JSON Lines
    /// record, `{name}_nanos` its field in the protobuf messages.
    pub const fn name(self) -> &'static str {
        match self {
            Cause::Network => "network",
            Cause::Overcount => "overcount",
            Cause::BlindSpot => "blind_spot",
            Cause::Unattributed => "unattributed",
            Cause::Queueing => "queueing",
            Cause::Truncated => "truncated",
            Cause::ClockSkew => "clock_skew",
        }
    }

    /// The cause's field name in the protobuf `Accounting` messages
    /// (`{name}_nanos`; decode errors name it).
    pub const fn proto_field_name(self) -> &'static str {
        match self {
            Cause::Network => "network_nanos",
            Cause::Overcount => "overcount_nanos",
            Cause::BlindSpot => "blind_spot_nanos",
            Cause::Unattributed => "unattributed_nanos",
            Cause::Queueing => "queueing_nanos",
            Cause::Truncated => "truncated_nanos",
            Cause::ClockSkew => "clock_skew_nanos",
        }
    }

    /// The cause's field number in every protobuf `Accounting` message (the
    /// path codec's and the collector's ingest messages).
    pub const fn field_number(self) -> u32 {
        self as u32 + 1
    }

    /// The cause with this field number.
    pub fn from_field_number(n: u32) -> Option<Cause> {
        Cause::ALL
            .get(usize::try_from(n).ok()?.checked_sub(1)?)
            .copied()
    }

    /// The cause with this [`name`](Cause::name).
    pub fn from_name(name: &str) -> Option<Cause> {
        Cause::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Time the path could not explain in detail, always kept in the total.
///
/// Every field except [`Accounting::overcount`], [`Accounting::truncated`]
/// and [`Accounting::clock_skew`] is also present on the path as segments of
/// the matching [`SegmentKind`](super::SegmentKind); overcount is time a
/// callee *claimed* beyond what the caller saw and was scaled away;
/// truncated is time whose detail was folded into parent frames to fit a
/// size limit. [`Accounting::get`], [`Accounting::set`] and
/// [`Accounting::iter`] reach the fields by [`Cause`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Accounting {
    /// Caller-observed minus callee-reported time, summed over RPCs.
    pub network: Duration,
    /// Callee-reported minus caller-observed time, summed; clamped away.
    pub overcount: Duration,
    /// Time in RPCs whose callee returned no usable path.
    pub blind_spot: Duration,
    /// Waits with no instrumented blocker.
    pub unattributed: Duration,
    /// Time between a node's creation and its first poll, on the path.
    pub queueing: Duration,
    /// Time whose frames were folded into parents to fit a size limit.
    pub truncated: Duration,
    /// Time cut from spans by clock-skew repair when the path was computed
    /// from an imported trace (children truncated to fit their parent,
    /// dropped wholly outside it, or overlapping siblings clipped). Not on
    /// the path; zero for paths the SDK recorded.
    pub clock_skew: Duration,
}

impl Accounting {
    /// The field of `cause`, mutably.
    pub fn get_mut(&mut self, cause: Cause) -> &mut Duration {
        match cause {
            Cause::Network => &mut self.network,
            Cause::Overcount => &mut self.overcount,
            Cause::BlindSpot => &mut self.blind_spot,
            Cause::Unattributed => &mut self.unattributed,
            Cause::Queueing => &mut self.queueing,
            Cause::Truncated => &mut self.truncated,
            Cause::ClockSkew => &mut self.clock_skew,
        }
    }

    /// The field of `cause`.
    pub fn get(&self, cause: Cause) -> Duration {
        let mut copy = *self;
        *copy.get_mut(cause)
    }

    /// Set the field of `cause`.
    pub fn set(&mut self, cause: Cause, d: Duration) {
        *self.get_mut(cause) = d;
    }

    /// Every cause with its time, in [`Cause::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Cause, Duration)> + '_ {
        Cause::ALL.into_iter().map(|c| (c, self.get(c)))
    }

    /// An accounting from `(cause, time)` pairs; a cause given twice keeps
    /// the last.
    pub fn from_causes(causes: impl IntoIterator<Item = (Cause, Duration)>) -> Accounting {
        let mut a = Accounting::default();
        for (c, d) in causes {
            a.set(c, d);
        }
        a
    }

    /// Field-wise saturating sum.
    pub fn add(&mut self, other: &Accounting) {
        for (c, d) in other.iter() {
            let f = self.get_mut(c);
            *f = f.saturating_add(d);
        }
    }

    /// True when every field is zero.
    pub fn is_zero(&self) -> bool {
        *self == Accounting::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_reaches_its_own_field() {
        let mut a = Accounting::default();
        for (i, c) in Cause::ALL.into_iter().enumerate() {
            a.set(c, Duration::from_nanos(i as u64 + 1));
        }
        let want = Accounting {
            network: Duration::from_nanos(1),
            overcount: Duration::from_nanos(2),
            blind_spot: Duration::from_nanos(3),
            unattributed: Duration::from_nanos(4),
            queueing: Duration::from_nanos(5),
            truncated: Duration::from_nanos(6),
            clock_skew: Duration::from_nanos(7),
        };
        assert_eq!(a, want);
        assert_eq!(Accounting::from_causes(want.iter()), want);
    }

    #[test]
    fn names_and_field_numbers_round_trip() {
        for c in Cause::ALL {
            assert_eq!(Cause::from_name(c.name()), Some(c));
            assert_eq!(Cause::from_field_number(c.field_number()), Some(c));
            assert_eq!(c.proto_field_name(), format!("{}_nanos", c.name()));
        }
        assert_eq!(Cause::from_field_number(0), None);
        assert_eq!(Cause::from_field_number(8), None);
        assert_eq!(Cause::from_name("latency"), None);
        // The field numbers the wire has always used.
        assert_eq!(Cause::Network.field_number(), 1);
        assert_eq!(Cause::ClockSkew.field_number(), 7);
    }

    #[test]
    fn add_saturates_field_by_field() {
        let mut a = Accounting {
            network: Duration::from_nanos(u64::MAX),
            queueing: Duration::from_nanos(3),
            ..Accounting::default()
        };
        a.add(&Accounting {
            network: Duration::from_nanos(5),
            queueing: Duration::from_nanos(4),
            clock_skew: Duration::from_nanos(1),
            ..Accounting::default()
        });
        assert_eq!(
            a.network,
            Duration::from_nanos(u64::MAX).saturating_add(Duration::from_nanos(5))
        );
        assert_eq!(a.queueing, Duration::from_nanos(7));
        assert_eq!(a.clock_skew, Duration::from_nanos(1));
    }
}
