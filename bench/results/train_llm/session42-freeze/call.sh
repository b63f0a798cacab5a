#!/usr/bin/env bash
# Session 42's GPU calls: scripts/gpu/w3-call.sh (options and arms documented there), with the
# work folders under /var/tmp/s42. Run from the repository root; carry .deps.
exec env CALL_TAG=s42 bash scripts/gpu/w3-call.sh "$@"
