"""Generated agent API code (scripts/gen-proto.sh) and the .proto it comes from."""
