/*
 * ch_core.h
 *		The public C API of the data plane's native core (docs/NATIVE.md
 *		section 3.6). What exists so far, step 1's first piece:
 *
 *		- the certification index (cert.c), a port of
 *		  coordinator/chorus/certifier.py's PyCertifier;
 *		- the apply scheduler (sched.c), a port of
 *		  coordinator/chorus/commit/scheduler.py's PyScheduler.
 *
 *		Both are held to their Python references' outputs, step by step, by
 *		tests/unit/test_dataplane_cert.py and test_dataplane_sched.py.
 *
 *		Plain C11, no Python.h, no global state. Each object lives in memory
 *		the caller allocates (ch_cert_size() or ch_sched_size() bytes, aligned
 *		for uint64_t), is set up by its _init and torn down by its _free, which
 *		releases what the object allocated but not the object itself. Every
 *		allocation is counted against the byte budget given to _init.
 *
 *		Errors are negative ch_status values. A call that fails with CH_EINVAL,
 *		CH_EFULL or CH_ENOMEM changed nothing the API can observe: each
 *		function allocates everything it needs before it changes any state.
 *		CH_ESTATE and CH_ECALLBACK are where the Python reference raises half
 *		way (a KeyError, an exception from the caller's fits function); the
 *		object is left exactly as the reference leaves its own.
 *
 *		Keys are 16-byte digests (wire.key_hash: BLAKE2b-128 of the key's
 *		parts), passed as n * 16 contiguous bytes, with their modes as n bytes
 *		(wire.KeyMode: 1 reference, 2 update, 3 exclusive). GIDs are uint64_t,
 *		as on the wire. Origins are small integers the caller maps node names
 *		to; 0 is the empty name, which a fresh slot holds.
 *
 *		This file is also the cffi declaration of the module
 *		(dataplane/build.py reads it, dropping the preprocessor lines): it holds
 *		declarations only, no macro a declaration depends on.
 */
#ifndef CH_CORE_H
#define CH_CORE_H

#include <stddef.h>
#include <stdint.h>

typedef enum ch_status
{
	CH_OK = 0,
	CH_EINVAL = -1,				/* an argument outside the contract */
	CH_EFULL = -2,				/* the object's byte budget would be exceeded */
	CH_ENOMEM = -3,				/* malloc failed */
	CH_ESTATE = -4,				/* a queue names a GID that is not registered */
	CH_ECALLBACK = -5			/* the caller's callback failed */
} ch_status;

/* ---- the certification index (cert.c) ---- */

typedef struct ch_cert ch_cert;

/* certifier.py's _Slot: the newest (gid, origin), and the one before it from another origin */
typedef struct ch_cert_slot
{
	uint64_t	gid;
	uint64_t	gid2;
	uint32_t	origin;
	uint32_t	origin2;
} ch_cert_slot;

/* One key of the index: its modes in the order they were first indexed, a slot each. */
typedef struct ch_cert_key
{
	uint8_t		digest[16];
	uint8_t		nmodes;
	uint8_t		modes[3];
	ch_cert_slot slots[3];		/* slots[i] is the slot of modes[i] */
} ch_cert_key;

typedef enum ch_cert_kind
{
	CH_CERT_OK = 0,				/* certified, and its keys indexed */
	CH_CERT_TOO_OLD = 1,		/* last_seen is below the horizon */
	CH_CERT_CONFLICT = 2		/* a conflicting key: key, gid, origin, schema say which */
} ch_cert_kind;

typedef struct ch_cert_verdict
{
	int			kind;			/* a ch_cert_kind */
	uint32_t	key;			/* CONFLICT: the index of the key in the writeset */
	uint64_t	gid;			/* CONFLICT: the GID that wrote it */
	uint32_t	origin;			/* CONFLICT: that GID's origin */
	int			schema;			/* CONFLICT: 1 if that GID is a recorded schema change */
} ch_cert_verdict;

extern size_t ch_cert_size(void);
extern int	ch_cert_init(ch_cert *c, uint64_t horizon, size_t max_bytes);
extern void ch_cert_free(ch_cert *c);
extern uint64_t ch_cert_horizon(const ch_cert *c);
extern size_t ch_cert_len(const ch_cert *c);
extern size_t ch_cert_bytes(const ch_cert *c);
extern int	ch_cert_certify(ch_cert *c, uint64_t gid, uint32_t origin, uint64_t last_seen,
							const uint8_t *digests, const uint8_t *modes, size_t n,
							ch_cert_verdict *v);
extern int	ch_cert_record(ch_cert *c, uint64_t gid, uint32_t origin,
						   const uint8_t *digests, const uint8_t *modes, size_t n);
extern int	ch_cert_purge(ch_cert *c, uint64_t horizon, size_t *dropped);

/* the snapshot's parts: keys in insertion order, the GID history, the schema GIDs */
extern size_t ch_cert_dump_keys(const ch_cert *c, ch_cert_key *out, size_t cap);
extern size_t ch_cert_history_len(const ch_cert *c);
extern size_t ch_cert_history_keys(const ch_cert *c);
extern void ch_cert_dump_history(const ch_cert *c, uint64_t *gids, uint32_t *counts,
								 uint8_t *digests);
extern size_t ch_cert_schema_len(const ch_cert *c);
extern void ch_cert_dump_schema(const ch_cert *c, uint64_t *out);

/* restoring a snapshot into an object just set up with its horizon */
extern int	ch_cert_load_key(ch_cert *c, const uint8_t *digest);
extern int	ch_cert_load_slot(ch_cert *c, const uint8_t *digest, int mode, const ch_cert_slot *slot);
extern int	ch_cert_load_history(ch_cert *c, uint64_t gid, const uint8_t *digests, size_t n);
extern int	ch_cert_load_schema(ch_cert *c, uint64_t gid);

/* ---- the apply scheduler (sched.c) ---- */

typedef struct ch_sched ch_sched;

/* PyScheduler.describe of one GID; waits_for holds the nwaits (at most 5) smallest */
typedef struct ch_sched_info
{
	int			scheduled;
	int			local;
	int			dispatched;
	int			replay;
	uint32_t	nwaits;
	uint64_t	waits_for[5];
} ch_sched_info;

/* Whether a run of n GIDs may be applied as one (1), not (0), or failed (negative). */
typedef int (*ch_sched_fits_fn) (void *arg, const uint64_t *run, size_t n);

extern size_t ch_sched_size(void);
extern int	ch_sched_init(ch_sched *s, size_t max_bytes);
extern void ch_sched_free(ch_sched *s);
extern size_t ch_sched_len(const ch_sched *s);
extern size_t ch_sched_queued(const ch_sched *s);
extern size_t ch_sched_remote_len(const ch_sched *s);
extern size_t ch_sched_bytes(const ch_sched *s);
extern int	ch_sched_add(ch_sched *s, uint64_t gid, const uint8_t *digests, const uint8_t *modes,
						 size_t n, int local, int barrier);
extern int	ch_sched_replay(ch_sched *s, uint64_t gid);
extern int	ch_sched_replay_all(ch_sched *s, uint64_t *out, size_t cap);
extern int	ch_sched_next_replay(ch_sched *s, uint64_t *gid);
extern int	ch_sched_ready_runs(ch_sched *s, size_t limit, size_t max_run,
								ch_sched_fits_fn fits, void *arg,
								uint64_t *gids, size_t cap, uint32_t *lens, size_t *nruns);
extern int	ch_sched_redispatch(ch_sched *s, uint64_t gid);
extern int	ch_sched_committed(ch_sched *s, uint64_t gid);
extern int	ch_sched_committed_upto(ch_sched *s, uint64_t gid);
extern void ch_sched_describe(const ch_sched *s, uint64_t gid, ch_sched_info *out);
extern size_t ch_sched_pending(const ch_sched *s, uint64_t *out, size_t cap);

#endif							/* CH_CORE_H */
