#!/usr/bin/env bash
# The lab needs what the whole project needs: one list, in .ci/install-deps.sh.
exec bash "$(dirname "$0")/../.ci/install-deps.sh" "$@"
