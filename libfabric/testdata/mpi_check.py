"""An MPI program over whatever transport mpirun gives it (the tests give
it udiwarp's libfabric provider): point-to-point messages (pickled
objects, which mpi4py receives with a matched probe, and raw buffers of
several sizes), collectives (barrier, bcast, scatter, gather, allgather,
alltoall) and reductions, each checked for its result. Prints one line,
"ok: N ranks", from rank 0, and exits non-zero on the first mismatch.
"""
import array
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def check(cond, what):
    if not cond:
        print(f"rank {rank}: FAIL: {what}", flush=True)
        comm.Abort(1)


# Point to point: a ring of pickled objects (probe, then receive).
right, left = (rank + 1) % size, (rank - 1) % size
got = comm.sendrecv({"from": rank, "data": list(range(rank * 10))}, dest=right, source=left)
check(got == {"from": left, "data": list(range(left * 10))}, f"ring object from {left}: {got}")

# Raw buffers, up to 4 MiB, each byte checked: tagged messages of every
# size the transport carries eagerly and by its large path.
for n in (0, 1, 100, 4096, 65536, 65537, 1 << 20, 4 << 20):
    pattern = bytes((i * 31 + rank) % 251 for i in range(min(n, 4096))) * (n // 4096 + 1)
    out = bytearray(pattern[:n])
    inbuf = bytearray(n)
    comm.Sendrecv(out, dest=right, sendtag=n % 1000, recvbuf=inbuf, source=left, recvtag=n % 1000)
    want = bytes((i * 31 + left) % 251 for i in range(min(n, 4096))) * (n // 4096 + 1)
    check(bytes(inbuf) == want[:n], f"{n}-byte buffer from {left}")

# A probe names what waits, and a message to ANY_SOURCE is matched.
if rank == 0:
    seen = set()
    for _ in range(size - 1):
        st = MPI.Status()
        comm.Probe(source=MPI.ANY_SOURCE, tag=77, status=st)
        msg = comm.recv(source=st.Get_source(), tag=77)
        check(msg == st.Get_source() * 1000, f"probed message {msg} from {st.Get_source()}")
        seen.add(st.Get_source())
    check(seen == set(range(1, size)), f"sources {seen}")
else:
    comm.send(rank * 1000, dest=0, tag=77)

# Collectives.
comm.Barrier()
b = comm.bcast({"root says": 42} if rank == 0 else None, root=0)
check(b == {"root says": 42}, f"bcast {b}")
s = comm.scatter([i * i for i in range(size)] if rank == 0 else None, root=0)
check(s == rank * rank, f"scatter {s}")
g = comm.gather(rank + 100, root=0)
if rank == 0:
    check(g == [i + 100 for i in range(size)], f"gather {g}")
ag = comm.allgather(rank)
check(ag == list(range(size)), f"allgather {ag}")
a2a = comm.alltoall([rank * 10 + i for i in range(size)])
check(a2a == [i * 10 + rank for i in range(size)], f"alltoall {a2a}")

# Reductions, checked: a sum of objects, and of a buffer of 100,000
# doubles (several hundred KiB a rank).
total = comm.allreduce(rank + 1, op=MPI.SUM)
check(total == size * (size + 1) // 2, f"allreduce sum {total}")
n = 100000
mine = array.array("d", [float(rank + i) for i in range(n)])
res = array.array("d", [0.0] * n)
comm.Allreduce(mine, res, op=MPI.SUM)
want = [float(size * i + size * (size - 1) // 2) for i in range(n)]
check(list(res) == want, "Allreduce of 100,000 doubles")
mx = comm.reduce(rank * 3, op=MPI.MAX, root=0)
if rank == 0:
    check(mx == (size - 1) * 3, f"reduce max {mx}")

comm.Barrier()
if rank == 0:
    print(f"ok: {size} ranks", flush=True)
sys.exit(0)
