"""Benchmark 6's history: what earlier changes did, from the profiles that led to them.

Side measurements at the commits they name, not of the run; the details print them as they are.
"""

PLANS_AND_QUEUE = """\
Two changes from measuring the store's statements one by one (issue 23, second pass; side
measurements recorded at cdcec1b, not of this run). (1) A claim marks the intents it takes
RUNNING with one UPDATE over their ids; with 128 ids or more
SQLite's planner preferred walking the by-state index through every queued intent (`EXPLAIN
QUERY PLAN`: a search of `effector_intents_by_state`), so a claim's cost grew with the backlog:
105 µs a row with 60,000 intents queued, against 10 µs once the state is checked on the row the
id finds (`+state`); a plan test now holds every UPDATE of the worker's path to the primary key.
(2) Schema 6 keys each key's queue index on TOOL intents without a result instead of on their
state (the same rows): SQLite rewrites a partial index's entry whenever a column its condition
reads changes, so every claim rewrote it; the claim's UPDATE went from 16.0 to 7.6 µs a row (7.5
with the index dropped altogether). Together, in the store's transactions alone (thread CPU,
three runs alternating with the revision before), an intent's store work went from 156-168 to
113-125 µs, record-and-claim's share from 106-116 to 73-83 µs."""


WHAT_REMAINS = """\
History (recorded at ca7b2eb and c6ad08d, not of this run): what was changed first, from
profiles of the effector's threads (cProfile, every thread, recorded at ca7b2eb, which then
found the store thread busy all the time while the event loop idled; superseded: this run's
figures of both threads are in "what is left"): each Submit used to be its own fsynced
transaction, so concurrent one-intent Submits queued for the disk. Submits now group-commit:
those that arrive while a transaction runs share the next one, answering as if recorded one
after another. The effector's RPCs no longer pass through a server interceptor on every call
(the tolerant request parsers are installed once, at registration). A sampling profile (py-spy)
of a sustained run then (recorded at c6ad08d) showed the store thread spending most of its time
in claims, in the query that finds each claimed key's next intent: it numbered every queued
intent of those keys with a window function, reading each row and its blob, to keep the first
per key. It now probes the queue index once per key (a correlated subquery on SQLite, a LATERAL
join on PostgreSQL), over an order of magnitude faster with many intents queued per key, which
lifted the sustained rate on both stores then. The same profile showed `Read` long-polls queued
behind the writes on that thread; SQLite reads now run on a read-only connection on a thread of
their own (in WAL mode they see the last commit without waiting for the writer), which keeps
reads answering while a write is in progress but did not move the sustained rate measurably in
alternating runs (recorded at 637ae6c). What the code does that the no-op floor does not: per
intent, a Submit checks the id, validates the arguments against the tool's Pydantic model,
digests and stores the intent and upserts its key's row, so with 500 intents per call the
store's own insert rate bounds the call rate (this run's bare insert-and-commit floor, above,
reaches only the fraction of the no-op rate shown there); on PostgreSQL each group commit is
four round trips through psycopg (BEGIN, the intents' INSERT ... RETURNING, the key rows'
upsert, COMMIT). Where a one-intent call waits in this run, and what the `synchronous=NORMAL`
row changes, is in "what is left"."""

EXECUTION_PATH = """\
The execution path (issue 23; side measurements recorded at 58e1e8d, not of this run), from
cProfile of every thread of one SQLite effector through a sustained run of 20,000 intents, the
effector's CPU time (rusage), and runs alternating the
previous revision with this one on the same machine. Before, the store's one writer thread was
busy nearly all the run, in 519 write transactions per 20,000 intents: for every step of every
key a claim transaction and a result transaction (245 and 242, of ~82 intents each), besides 20
Submit groups; their BEGIN and COMMIT alone took 4.4 s of its 11.1 s. Each sync tool call woke
the event loop on its own (20,474 self-pipe writes from the tool threads), and each claim drew a
`uuid4` (a system call per intent). Changed: (1) the commit that records a group of results also
claims work for the slots they free (`record_and_claim`), so the claim loop no longer runs after
every result, only when Submits or a key given back wake it; a key's next intent still starts
only after the commit that made the result before it durable and published, and the released
keys queue behind keys that waited longer. On SQLite it is the same transaction; on PostgreSQL a
second one right after, because in one the key rows stayed locked through the claim while
Submits to the same keys waited for them (alternating runs: 2,300-2,800 intents/s in one
transaction, 3,000-4,800 in two). (2) Results and claims are written with set-based statements
(`UPDATE ... FROM` a `VALUES` list) after locking the key rows in key order, not one statement
step per row. (3) Sync tools' results reach the loop through one inbox per loop, one wake-up per
batch (663 self-pipe writes in all instead of 20,474). (4) Claim tokens are a random per-process
prefix and a counter. After: 196 write transactions per 20,000 intents on SQLite (157
record-and-claim transactions of ~128 intents, 22 Submit groups); in alternating runs the
effector's CPU per two runs of 20,000 fell from 13.2-13.4 s to 10.8-11.7 s and the sustained
rate rose from 2,400-2,650 to 2,800-3,400 intents/s on SQLite, and from 1,850-2,770 to
3,000-4,800 on PostgreSQL, with the machine shared with other runs (load average 4 to 10). Where
the rest went then, short of 9,000/s (measured at the time, not in this run): the effector spent
~270 µs of CPU per intent (both threads, kernel included), 2.4x the 111 µs that 9,000/s leaves
on one core, and its Python ran under one GIL. Under the profiler the event loop spent 185 µs
per intent in the worker's path (validating the arguments again, the pooled-thread hop of the
sync `noop` tool, its timeout, a task per intent) and 79 µs in Submit; the writer, per
record-and-claim transaction of ~128 intents, 9.4 ms in the UPDATE recording the results and 9.5
ms in the one marking the next intents RUNNING (an intent row is rewritten, blobs and all, at
its claim and at its result, and each state change moves its entries in the indexes that carry
the state), and 27 ms in BEGIN and COMMIT on the shared disk. On PostgreSQL the two replicas,
the server and the client shared the machine's cores, and Submits and results lock the same key
rows (their pending counts). The next change named then: write each intent row twice instead of
three times (keep the running claim and its attempt on the key row, which already holds the
claim's token and intent id), take the state out of the by-tool and by-state indexes' leading
columns, validate arguments once at Submit and keep the validated form, and on PostgreSQL stop
counting pending intents on the key row that Submits and results both lock."""


SQLITE_SCHEMA = """\
The writer's share is split by transaction in the profile findings (this run's code, under the
profiler); what it does per intent follows from the schema: each intent row is written three
times (at Submit, at its claim, at its result), each state change moves its entries in the
by-state and by-tool indexes, and the key-ordered indexes (the primary key, the by-key and the
queue index) take a leaf page per intent because a batch's keys are spread over them. Earlier
side measurements, not of this run, sized those parts: recorded at cdcec1b (schema 6; the
store's transactions alone, 3 x 20,000 intents in batches of 500, results in groups of 128) the
fsynced COMMITs wrote 2.7 WAL pages per intent (one at Submit, 1.7 at its result and the claim
after it); when the sustained rate was about 3,300/s (recorded at 2caff7c), dropping the by-key,
by-state, by-tool and completed indexes (which the console's queries need) reached 3,600-4,100
intents/s, 10-25% of the rate, each of the first three costing 4-6 KiB written and 15-35 µs of
the writer's CPU per intent; recorded at 9774df3, moving SQLite's checkpoints onto a thread of
their own cut the store's transactions alone by about a tenth but did not move the sustained
rate measurably, and a GIL switch interval of 0.2 ms instead of 5 did not shorten the writer's
waits inside its transactions."""
"""What the SQLite writer does per intent, and the side measurements that sized it."""

VALIDATION_TIMED = """\
Outside the profiler, `prepare_call` for the `noop` tool (the tool's lookup, the JSON parse and
`validate_arguments`, which alone took 2.2 µs) took 3.7 µs (a side measurement recorded at
6fe19ef, timeit): the profile's share for validating again may overstate what keeping the
validated arguments saves."""
