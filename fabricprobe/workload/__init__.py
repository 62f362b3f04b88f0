"""A disaggregated inference pipeline without a GPU: real KV-cache-sized transfers."""
