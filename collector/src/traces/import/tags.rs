//! Tag / attribute values shared by the readers, and the error markers they
//! recognise.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A tag value, keeping only what the importers look at. Objects and arrays
/// are skipped without allocating.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum TagValue<'a> {
    Str(Cow<'a, str>),
    Bool(bool),
    Num(f64),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for TagValue<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TagVisitor(std::marker::PhantomData))
    }
}

struct TagVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for TagVisitor<'a> {
    type Value = TagValue<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tag value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(TagValue::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(TagValue::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(TagValue::Str(Cow::Owned(v)))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(TagValue::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(TagValue::Num(v as f64))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(TagValue::Num(v as f64))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(TagValue::Num(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(TagValue::Other)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(TagValue::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(TagValue::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(TagValue::Other)
    }
}

impl TagValue<'_> {
    fn as_f64(&self) -> Option<f64> {
        match self {
            TagValue::Num(n) => Some(*n),
            TagValue::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }
}

/// True when a tag marks its span as failed: `error` (bool `true` or any
/// string but `"false"`), `http.status_code` / `http.response.status_code`
/// ≥ 400, `grpc.status` / `rpc.grpc.status_code` other than OK / 0,
/// `otel.status_code = ERROR`.
pub(crate) fn is_error_tag(key: &str, v: &TagValue<'_>) -> bool {
    match key {
        "error" => match v {
            TagValue::Bool(b) => *b,
            TagValue::Str(s) => !s.is_empty() && !s.eq_ignore_ascii_case("false"),
            _ => false,
        },
        "http.status_code" | "http.response.status_code" => v.as_f64().is_some_and(|c| c >= 400.0),
        "grpc.status" | "grpc.status_code" | "rpc.grpc.status_code" => match v {
            TagValue::Str(s) => s
                .parse::<f64>()
                .map_or(!s.eq_ignore_ascii_case("ok"), |c| c != 0.0),
            TagValue::Num(n) => *n != 0.0,
            _ => false,
        },
        "otel.status_code" => matches!(v, TagValue::Str(s) if s.eq_ignore_ascii_case("error")),
        _ => false,
    }
}
