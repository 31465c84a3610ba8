# Source this file to use OpBench from a checkout without installing it:  source env_var.sh
OPBENCH_HOME="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
export OPBENCH_HOME
export PYTHONPATH="$OPBENCH_HOME/python${PYTHONPATH:+:$PYTHONPATH}"
