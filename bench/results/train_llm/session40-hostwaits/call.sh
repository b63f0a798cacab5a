#!/usr/bin/env bash
# Session 40's GPU calls: scripts/gpu/w3-call.sh (which began as this file; its options and arms
# are documented there), with the work folders under /var/tmp/s40. Run from the repository root;
# carry .deps.
exec env CALL_TAG=s40 bash scripts/gpu/w3-call.sh "$@"
