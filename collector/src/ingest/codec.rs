//! A tonic codec for the hand-written prost messages.
//!
//! tonic 0.14 moved its prost codec into `tonic-prost`, which maps a decode
//! failure to `INTERNAL`. A malformed batch is the client's fault, so this
//! codec reports it as `INVALID_ARGUMENT` with prost's message (which names
//! the field), and saves a dependency.

use std::io;
use std::marker::PhantomData;

use bytes::Buf;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Encodes `E`, decodes `D`.
#[derive(Debug)]
pub(crate) struct WireCodec<E, D>(PhantomData<fn(E) -> D>);

impl<E, D> Default for WireCodec<E, D> {
    fn default() -> Self {
        WireCodec(PhantomData)
    }
}

impl<E, D> Codec for WireCodec<E, D>
where
    E: prost::Message + Send + 'static,
    D: prost::Message + Default + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = WireEncoder<E>;
    type Decoder = WireDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        WireEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        WireDecoder(PhantomData)
    }
}

#[derive(Debug)]
pub(crate) struct WireEncoder<E>(PhantomData<fn(E)>);

impl<E: prost::Message> Encoder for WireEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.encoded_len());
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding failed: {e}")))
    }
}

#[derive(Debug)]
pub(crate) struct WireDecoder<D>(PhantomData<fn() -> D>);

impl<D: prost::Message + Default> Decoder for WireDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        let msg = D::decode(src.copy_to_bytes(src.remaining()))
            .map_err(|e| Status::invalid_argument(format!("malformed protobuf message: {e}")))?;
        Ok(Some(msg))
    }
}

// Encoder/Decoder need `Error: From<io::Error>`; Status has it.
const _: fn(io::Error) -> Status = Status::from;
