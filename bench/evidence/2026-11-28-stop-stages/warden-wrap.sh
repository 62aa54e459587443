#!/bin/sh
# The bench drops warden's stdout (where its logs go): send them to stderr.
exec "$H_STOP2_WARDEN" "$@" 1>&2
