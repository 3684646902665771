#!/bin/sh
# nsrsh.sh: Open MPI's remote shell agent (--mca plm_rsh_agent) for hosts
# that are network namespaces on this machine: "nsrsh.sh HOST COMMAND..."
# runs COMMAND in namespace HOST, as ssh would run it on host HOST.
host=$1
shift
exec ip netns exec "$host" sh -c "$*"
