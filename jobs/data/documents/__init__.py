"""Packed long-context documents: sources (ArrayRecord / Parquet, local or gs://), packers, the iterator."""

from jobs.data.documents.loader import DocumentIterator, Options, check
from jobs.data.documents.sources import decode_record, encode_record

__all__ = ["DocumentIterator", "Options", "check", "decode_record", "encode_record"]
