#!/usr/bin/env bash
# Session 33, call 1: session 32's call 1 as it was (the CUDA tests of positioning and the plan
# margin, then W3 with 1 of 32 layers recomputed, two measured steps, evictions and demand fetches
# logged, device waits against the simulation), now with positioning that also fetches back
# (positioned_back, new in session 32, first GPU run). Its own run directory.
RUNS=/var/tmp/teraio/s33c1 exec bash "$(dirname "$0")/../session32-margin/call1.sh"
