"""Memory of one MPI rank after it has talked to every other rank, for
experiments/mpi-memory.sh (seed 003's FIG 8 analogue).

Every rank exchanges messages with every other rank, point to point
(MPI_Sendrecv in a pairwise schedule: in step k a rank sends to rank + k
and receives from rank - k), at each size in argv (bytes; default 64 and
1 MiB, one size a transport sends eagerly and one it sends by its large
path), then all at once (MPI_Alltoall of 64 bytes a peer). So a transport
that keeps state per peer (a connection, its buffers) has it for every
peer by the end. Buffers are allocated before the first reading, and
their size does not grow with the ranks (but for the all-to-all's 64
bytes a peer), so the growth is the transport's.

Each rank reads its own VmRSS and VmHWM (/proc/self/status, KiB) after
MPI_Init and a barrier ("before") and after the exchange ("after"), and
rank 0 prints one line a rank:

    MEM rank=R ranks=N rss_before_kib=.. rss_kib=.. hwm_kib=..

and then "ok: N ranks". Run with /usr/bin/python3 (Debian's
python3-mpi4py).
"""
import sys

from mpi4py import MPI


def status():
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                got[key] = int(value.split()[0])  # kB
    return got


comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
sizes = [int(a) for a in sys.argv[1:]] or [64, 1 << 20]
repeats = 3

send = bytearray(max(sizes))
recv = bytearray(max(sizes))
a2a_send = bytearray(64 * size)
a2a_recv = bytearray(64 * size)
# Touch every page, so that the buffers count before as after.
send[::4096] = bytes([rank & 0xFF]) * len(range(0, len(send), 4096))
recv[::4096] = bytes([1]) * len(range(0, len(recv), 4096))

comm.Barrier()
before = status()

for n in sizes:
    for _ in range(repeats):
        for k in range(1, size):
            dest, source = (rank + k) % size, (rank - k) % size
            comm.Sendrecv([send, n, MPI.BYTE], dest=dest, sendtag=k,
                          recvbuf=[recv, n, MPI.BYTE], source=source, recvtag=k)
            if n and recv[0] != source & 0xFF:
                print(f"rank {rank}: FAIL: {n} bytes from {source} start {recv[0]}", flush=True)
                comm.Abort(1)
for _ in range(repeats):
    comm.Alltoall([a2a_send, MPI.BYTE], [a2a_recv, MPI.BYTE])

comm.Barrier()
after = status()
rows = comm.gather((rank, before["VmRSS"], after["VmRSS"], after["VmHWM"]), root=0)
if rank == 0:
    for r, b, a, h in rows:
        print(f"MEM rank={r} ranks={size} rss_before_kib={b} rss_kib={a} hwm_kib={h}", flush=True)
    print(f"ok: {size} ranks", flush=True)
