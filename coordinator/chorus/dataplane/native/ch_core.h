/*
 * ch_core.h
 *		The public C API of the data plane's native core (docs/NATIVE.md
 *		section 3.6). What exists so far, step 1's first piece:
 *
 *		- the certification index (cert.c), a port of
 *		  coordinator/chorus/certifier.py's PyCertifier;
 *		- the apply scheduler (sched.c), a port of
 *		  coordinator/chorus/commit/scheduler.py's PyScheduler;
 *		- the writeset scan (scan.c, with extension/chorus_wsread.c and
 *		  blake2b.c), wire.scan's reading of what certification needs;
 *		- the order core (order.c), dataplane/order.py's OrderCore without
 *		  its Python objects and texts.
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
	CH_ECALLBACK = -5,			/* the caller's callback failed */
	CH_EWIRE = -6				/* a malformed writeset (ch_scan_info.err says how) */
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

/* ---- the writeset scan (scan.c) ---- */

/* One certification key of a scanned writeset: its parts are len bytes at off in the writeset */
typedef struct ch_scan_key
{
	uint8_t		digest[16];		/* wire.key_hash of its parts */
	uint8_t		mode;
	uint16_t	nparts;
	uint64_t	off;
	uint64_t	len;
} ch_scan_key;

typedef struct ch_scan_info
{
	int			err;			/* a ChorusWsrError (extension/chorus_wsread.h), 0 if good */
	uint64_t	err_pos;
	uint64_t	err_value;
	uint64_t	err_expected;
	uint8_t		flags;			/* CHORUS_WS_FLAG_* */
	uint32_t	xid;
	uint32_t	pid;
	uint64_t	last_seen;
	uint16_t	encoding;
	uint16_t	ntables;
	uint32_t	nrows;
	uint32_t	nschema;		/* schema change items among the rows */
	uint32_t	nkeys;
} ch_scan_info;

extern int	ch_scan(const uint8_t *buf, size_t len, ch_scan_info *info, ch_scan_key *keys, size_t cap);
extern void ch_blake2b(const uint8_t *data, size_t len, uint8_t *out, size_t outlen);

/* ---- the words of a key (text.c) ---- */

extern size_t ch_key_describe(const uint8_t *parts, size_t len, uint32_t nparts, char *out, size_t cap);

/* ---- the outcome index (outcomes.c): outcomes.py's OutcomeIndex ---- */

typedef struct ch_outcomes ch_outcomes;

extern size_t ch_outcomes_size(void);
extern int	ch_outcomes_init(ch_outcomes *x, size_t size, size_t max_bytes);
extern void ch_outcomes_free(ch_outcomes *x);
extern void ch_outcomes_seen(ch_outcomes *x, uint64_t gid);
extern void ch_outcomes_record(ch_outcomes *x, uint32_t origin, uint32_t xid, uint64_t gid, int ok);
extern int	ch_outcomes_get(const ch_outcomes *x, uint32_t origin, uint32_t xid, uint64_t *gid, int *ok);
extern size_t ch_outcomes_len(const ch_outcomes *x);
extern int64_t ch_outcomes_complete_after(const ch_outcomes *x);
extern void ch_outcomes_renumber(ch_outcomes *x, const uint32_t *map, size_t n);

/* ---- the order core (order.c) ---- */

typedef struct ch_order ch_order;

/* What a call of the order core produced, in order (ch_order_take). */
typedef enum ch_order_kind
{
	CH_OUT_LEFT = 1,			/* a local writeset not taken (not following, not quorate, origin not online): ticket */
	CH_OUT_MALFORMED = 2,		/* gid, local, ticket, ref, scan_err: the writeset did not scan */
	CH_OUT_CERTIFIED = 3,		/* gid, local, ticket, origin, ref, xid, last_seen, v: a certification's outcome */
	CH_OUT_RELEASE = 4,			/* gid, prev, local, ticket, origin, ref, settle: a certified writeset released */
	CH_OUT_RECEIVED = 5,		/* gid: report on the bus what this node delivered */
	CH_OUT_UNKNOWN = 6,			/* gid, ticket, ref: a local writeset whose fate is unknown (leave) */
	CH_OUT_DDL = 7				/* gid, settle: a schema change's outcome is known (ddl_settled) */
} ch_order_kind;

typedef struct ch_order_out
{
	int			kind;			/* a ch_order_kind */
	int			local;
	int			link;			/* a link writeset's (ch_order_link_writeset) */
	int			settle;
	int			scan_err;		/* a ChorusWsrError, or -1: a link writeset with a schema change */
	uint32_t	origin;
	uint32_t	xid;
	uint64_t	gid;
	uint64_t	prev;
	uint64_t	ticket;
	uint64_t	ref;			/* the caller's handle of the writeset */
	uint64_t	last_seen;
	ch_cert_verdict v;
} ch_order_out;

/* OrderCore.stats' counters: the caller may read and write them in place */
typedef struct ch_order_stats
{
	uint64_t	delivered;
	uint64_t	certified;
	uint64_t	cert_failures;
	uint64_t	local_certified;
	uint64_t	local_failed;
	uint64_t	remote_certified;
	uint64_t	malformed;
} ch_order_stats;

/* The order's counters and what the control plane set, read in place (ch_order_view) */
typedef struct ch_order_state
{
	uint64_t	gid;			/* the last GID given */
	uint64_t	last_certified;
	uint64_t	released;
	uint64_t	held;			/* certified, waiting for a quorum */
	uint64_t	deferred;		/* waiting for a schema change's outcome */
	uint64_t	ddl_open;		/* schema changes whose outcome is open */
	uint64_t	reported;
	int64_t		report_last_tick;
	int			report_on_bus;
	int			following;
	int			quorate;
	uint32_t	own;			/* this node's bus node (an id of the caller's) */
	uint32_t	quorum;
	uint32_t	expected;
	uint32_t	tie_breaker;	/* a bus node id, 0: none */
	ch_order_stats stats;
} ch_order_state;

/* The control plane's schema-change round (OrderCore.open_round): 1 opened, 0 not, < 0 failed */
typedef int (*ch_order_round_fn) (void *arg, uint64_t gid, uint32_t origin);

extern size_t ch_order_size(void);
extern int	ch_order_init(ch_order *o, ch_cert *cert, size_t max_bytes);
extern void ch_order_free(ch_order *o);
extern void ch_order_set_outcomes(ch_order *o, ch_outcomes *x);
extern size_t ch_order_bytes(const ch_order *o);
extern ch_order_state *ch_order_view(ch_order *o);
extern const ch_order_out *ch_order_take(const ch_order *o, size_t *n);
extern void ch_order_set_votes(ch_order *o, uint32_t quorum, uint32_t expected, uint32_t tie_breaker);
extern int	ch_order_set_joined(ch_order *o, const uint32_t *nodes, const uint64_t *gids, size_t n);
extern int	ch_order_writeset(ch_order *o, uint32_t origin, int local, int online, uint64_t ticket,
							  uint64_t ref, const uint8_t *buf, size_t len,
							  ch_order_round_fn round, void *arg);
extern int	ch_order_link_writeset(ch_order *o, uint32_t origin, int online, uint64_t ref,
								   const uint8_t *buf, size_t len);
extern int	ch_order_ddl_settled(ch_order *o, uint64_t gid, int ok, int content,
								 const uint8_t *digests, const uint8_t *modes, size_t n,
								 ch_order_round_fn round, void *arg);
extern int	ch_order_release(ch_order *o);
extern int	ch_order_received(ch_order *o, uint32_t node, uint64_t gid, int own, int in_view);
extern int	ch_order_tick(ch_order *o);
extern void ch_order_view_changed(ch_order *o, uint32_t quorum, uint32_t expected, uint32_t tie_breaker);
extern int	ch_order_install(ch_order *o, ch_cert *cert, uint64_t gid, uint64_t certified,
							 uint64_t released, const ch_order_out *unstable, size_t n);
extern int	ch_order_leave(ch_order *o);
extern size_t ch_order_unstable(const ch_order *o, ch_order_out *out, size_t cap);
extern size_t ch_order_ddl_open(const ch_order *o, uint64_t *gids, uint32_t *origins, size_t cap);
extern size_t ch_order_received_nodes(const ch_order *o, uint32_t *nodes, uint64_t *gids, size_t cap);

#endif							/* CH_CORE_H */
