# Sourced by the shell tests (tests/integration/*_test.sh, tests/rules/capture_golden.sh): TAP-style
# results and the two waits they all need.
#   ok MSG / bad MSG     one result line; `passes` and `fails` count them
#   free_port            a TCP port free on 127.0.0.1 now
#   retry SECONDS CMD... until CMD succeeds (every 0.2 s); fails after SECONDS
passes=0; fails=0
ok() { passes=$((passes+1)); echo "ok - $*"; }
bad() { fails=$((fails+1)); echo "not ok - $*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
retry() { local n=$(( $1 * 5 )); shift; for _ in $(seq "$n"); do "$@" && return 0; sleep 0.2; done; return 1; }
