/*
 * order.c
 *		The order core (docs/NATIVE.md section 2.6): a port of
 *		coordinator/chorus/dataplane/order.py's OrderCore, the reference, for
 *		what every writeset delivered in total order goes through. It gives
 *		the GID, scans the writeset (scan.c), defers it behind a schema change
 *		whose outcome is open, certifies it (cert.c), and holds the certified
 *		ones until bus nodes with a quorum of votes have delivered them
 *		(uniform commit), then releases them; with the Received reports, the
 *		tick's re-report, a view's reset, leaving the primary component and
 *		installing a joined state; and the writesets of peer sites' links.
 *		tests/unit/test_dataplane_order.py holds it
 *		to the reference step by step.
 *
 *		What it does not hold, and its caller (dataplane/native.py,
 *		NativeOrderCore) does: the Python objects the actions carry (each
 *		writeset is known here by the caller's handle, ref), the texts
 *		(verdict reasons, conflicts, the outcome index), node names (origins
 *		and bus nodes are ids of the caller's: the certification index's
 *		origin ids, and bus node ids whose 0 is ""), and what the control
 *		plane decides: whether an origin is online is an argument of each
 *		writeset, the members' join GIDs are set when they change.
 *
 *		Each call's outputs are read with ch_order_take until the next call.
 *		Errors as in cert.c: room is made before anything changes, except
 *		that a certification refused by the index's budget or a schema-change
 *		round callback that fails (CH_ECALLBACK, where the reference raises)
 *		stops the call half way, as the reference stops on an exception.
 */
#include <string.h>

#include "ch_mem.h"
#include "chorus_wire.h"

/* a certified writeset waiting for a quorum (OrderCore._unstable) */
typedef struct ord_held
{
	uint64_t	gid;
	uint64_t	prev;
	uint64_t	ticket;
	uint64_t	ref;
	uint32_t	origin;
	uint8_t		local;
	uint8_t		link;
	uint8_t		settle;
} ord_held;

/* What _certify needs of a writeset. */
typedef struct ord_ws
{
	uint64_t	gid;
	uint64_t	ticket;
	uint64_t	ref;
	uint64_t	last_seen;
	uint32_t	origin;
	uint32_t	xid;
	uint8_t		local;
	uint8_t		link;			/* a peer site's transaction (docs/LINKS.md section 3) */
	uint8_t		flags;
	size_t		nkeys;
	const uint8_t *digests;
	const uint8_t *modes;
} ord_ws;

/* a scanned writeset waiting for a schema change's outcome (OrderCore._deferred) */
typedef struct ord_deferred
{
	ord_ws		w;
	uint8_t    *keys;			/* its nkeys digests, then nkeys modes (w points into them) */
} ord_deferred;

typedef struct ord_pair
{
	uint32_t	node;
	uint64_t	gid;
} ord_pair;

/* a queue as an array read from head (the reference's lists popped at the front) */
#define QUEUE(type, name) type *name; size_t name##_cap; size_t name##_head; size_t name##_len

struct ch_order
{
	ch_order_state st;
	ch_mem		mem;
	ch_cert    *cert;
	ch_outcomes *outcomes;		/* recorded into as it certifies (NULL: not) */

	QUEUE(ord_held, held);
	QUEUE(ord_deferred, def);
	ord_pair   *ddl;			/* open schema changes: (origin, gid), in GID order */
	size_t		ddl_cap;
	ord_pair   *recv;			/* bus node -> GID it reported, in first-report order */
	size_t		recv_cap;
	size_t		recv_len;
	ord_pair   *joined;			/* bus node -> GID it joined at */
	size_t		joined_cap;
	size_t		joined_len;

	ch_order_out *out;
	size_t		out_cap;
	size_t		out_len;

	ch_scan_key *keys;			/* scratch of the scan */
	size_t		keys_cap;
	uint8_t    *packed;			/* scratch: digests and modes for the index */
	size_t		packed_cap;
	uint32_t   *nodes;			/* scratch: the bus nodes known to have a GID */
	size_t		nodes_cap;
};

/* Record the outcomes of what it certifies into x (outcomes.c), or not (NULL) */
void
ch_order_set_outcomes(ch_order *o, ch_outcomes *x)
{
	o->outcomes = x;
}

size_t
ch_order_size(void)
{
	return sizeof(ch_order);
}

int
ch_order_init(ch_order *o, ch_cert *cert, size_t max_bytes)
{
	memset(o, 0, sizeof(*o));
	o->mem.limit = max_bytes;
	o->cert = cert;
	o->st.report_last_tick = -1;
	o->st.quorum = 1;
	return CH_OK;
}

static void
drop_deferred(ch_order *o, ord_deferred *d)
{
	ch_mem_release(&o->mem, d->keys, d->w.nkeys * 17);
	d->keys = NULL;
}

static void
clear_deferred(ch_order *o)
{
	for (size_t i = o->def_head; i < o->def_len; i++)
		drop_deferred(o, &o->def[i]);
	o->def_head = o->def_len = 0;
	o->st.deferred = 0;
}

void
ch_order_free(ch_order *o)
{
	clear_deferred(o);
	ch_mem_release(&o->mem, o->held, o->held_cap * sizeof(ord_held));
	ch_mem_release(&o->mem, o->def, o->def_cap * sizeof(ord_deferred));
	ch_mem_release(&o->mem, o->ddl, o->ddl_cap * sizeof(ord_pair));
	ch_mem_release(&o->mem, o->recv, o->recv_cap * sizeof(ord_pair));
	ch_mem_release(&o->mem, o->joined, o->joined_cap * sizeof(ord_pair));
	ch_mem_release(&o->mem, o->out, o->out_cap * sizeof(ch_order_out));
	ch_mem_release(&o->mem, o->keys, o->keys_cap * sizeof(ch_scan_key));
	ch_mem_release(&o->mem, o->packed, o->packed_cap);
	ch_mem_release(&o->mem, o->nodes, o->nodes_cap * sizeof(uint32_t));
	memset(o, 0, sizeof(*o));
}

size_t
ch_order_bytes(const ch_order *o)
{
	return o->mem.used;
}

ch_order_state *
ch_order_view(ch_order *o)
{
	return &o->st;
}

const ch_order_out *
ch_order_take(const ch_order *o, size_t *n)
{
	*n = o->out_len;
	return o->out;
}

/* ---- room ---- */

/* Room for add more at the end of a queue, moving its live part to the front first. */
static int
queue_reserve(ch_mem *m, void **buf, size_t *cap, size_t *head, size_t *len, size_t add, size_t elem)
{
	if (*head > 0 && *len + add > *cap)
	{
		memmove(*buf, (uint8_t *) *buf + *head * elem, (*len - *head) * elem);
		*len -= *head;
		*head = 0;
	}
	return ch_grow(m, buf, cap, *len, add, elem);
}

/* Room for the outputs of a call that may release every held writeset and a few more. */
static int
reserve_out(ch_order *o, size_t more)
{
	size_t		held = o->held_len - o->held_head;

	return ch_grow(&o->mem, (void **) &o->out, &o->out_cap, o->out_len, held + more, sizeof(ch_order_out));
}

/* Start a call: no outputs yet, room for some. */
static int
begin(ch_order *o, size_t more)
{
	o->out_len = 0;
	return reserve_out(o, more);
}

static ch_order_out *
emit(ch_order *o, int kind)
{
	ch_order_out *r = &o->out[o->out_len++];

	memset(r, 0, sizeof(*r));
	r->kind = kind;
	return r;
}

/* A held writeset as a RELEASE record. */
static void
put_held(ch_order_out *r, const ord_held *h)
{
	memset(r, 0, sizeof(*r));
	r->kind = CH_OUT_RELEASE;
	r->gid = h->gid;
	r->prev = h->prev;
	r->local = h->local;
	r->ticket = h->ticket;
	r->origin = h->origin;
	r->ref = h->ref;
	r->settle = h->settle;
	r->link = h->link;
}

/* ---- uniform commit ---- */

static uint64_t
pair_get(const ord_pair *p, size_t n, uint32_t node, bool *found)
{
	for (size_t i = 0; i < n; i++)
		if (p[i].node == node)
		{
			*found = true;
			return p[i].gid;
		}
	*found = false;
	return 0;
}

/* Votes.holds: a strict majority, or exactly half with the tie breaker among them. */
static bool
holds(const ch_order *o, const uint32_t *nodes, size_t n)
{
	if (n >= o->st.quorum)
		return true;
	if (o->st.tie_breaker == 0 || 2 * n != o->st.expected)
		return false;
	for (size_t i = 0; i < n; i++)
		if (nodes[i] == o->st.tie_breaker)
			return true;
	return false;
}

/* OrderCore._covered: whether a quorum of bus nodes is known to have delivered gid. */
static bool
covered(const ch_order *o, uint64_t gid, uint32_t *nodes)
{
	size_t		n = 0;
	bool		own = false;
	bool		found;

	for (size_t i = 0; i < o->recv_len; i++)
	{
		const ord_pair *r = &o->recv[i];

		if (r->gid >= gid && pair_get(o->joined, o->joined_len, r->node, &found) < gid)
		{
			nodes[n++] = r->node;
			own = own || r->node == o->st.own;
		}
	}
	if (o->st.gid >= gid && !own)
		nodes[n++] = o->st.own;
	return holds(o, nodes, n);
}

/* OrderCore.release (room for its outputs reserved). */
static int
release(ch_order *o)
{
	size_t		n = 0;
	int			rc;

	if (o->st.quorum > 1 && o->st.following && !o->st.report_on_bus && o->st.gid > o->st.reported)
	{
		o->st.reported = o->st.gid;
		o->st.report_on_bus = 1;
		emit(o, CH_OUT_RECEIVED)->gid = o->st.gid;
	}
	if (o->held_head == o->held_len)
	{
		if (o->st.last_certified > o->st.released)
			o->st.released = o->st.last_certified;
		return CH_OK;
	}
	if ((rc = ch_grow(&o->mem, (void **) &o->nodes, &o->nodes_cap, 0, o->recv_len + 1, sizeof(uint32_t))) != CH_OK)
		return rc;
	while (o->held_head + n < o->held_len && covered(o, o->held[o->held_head + n].gid, o->nodes))
	{
		put_held(&o->out[o->out_len++], &o->held[o->held_head + n]);
		n++;
	}
	if (n > 0)
	{
		o->st.released = o->held[o->held_head + n - 1].gid;
		o->held_head += n;
		if (o->held_head == o->held_len)
			o->held_head = o->held_len = 0;
		o->st.held -= n;
	}
	return CH_OK;
}

/* OrderCore._hold: released at once when this bus node alone is a quorum, else held. */
static int
hold(ch_order *o, const ord_held *h)
{
	int			rc;

	if (o->st.quorum <= 1 && o->held_head == o->held_len && o->st.tie_breaker == 0)
	{
		if ((rc = reserve_out(o, 1)) != CH_OK)
			return rc;
		o->st.released = h->gid;
		put_held(&o->out[o->out_len++], h);
		return CH_OK;
	}
	if ((rc = queue_reserve(&o->mem, (void **) &o->held, &o->held_cap, &o->held_head, &o->held_len, 1,
							sizeof(ord_held))) != CH_OK ||
		(rc = reserve_out(o, 3)) != CH_OK)
		return rc;
	o->held[o->held_len++] = *h;
	o->st.held++;
	return release(o);
}

/* ---- certification ---- */

/* OrderCore._certify */
static int
certify(ch_order *o, const ord_ws *w, ch_order_round_fn round, void *arg)
{
	ch_cert_verdict v;
	ord_held	h;
	bool		toi = (w->flags & CHORUS_WS_FLAG_TOI) != 0;
	int			rc;

	if ((rc = reserve_out(o, 4)) != CH_OK)
		return rc;
	if (toi)
	{
		/* total order isolation: never fails; its keys come with its outcome */
		if ((rc = ch_grow(&o->mem, (void **) &o->ddl, &o->ddl_cap, o->st.ddl_open, 1, sizeof(ord_pair))) != CH_OK)
			return rc;
		o->ddl[o->st.ddl_open++] = (ord_pair) {w->origin, w->gid};
		memset(&v, 0, sizeof(v));
	}
	else
	{
		ch_order_out *r;

		/* a link writeset is a blind write ordered at its GID: it saw everything before it */
		uint64_t	last_seen = w->link ? w->gid - 1 : w->last_seen;

		if ((rc = ch_cert_certify(o->cert, w->gid, w->origin, last_seen, w->digests, w->modes, w->nkeys,
								  &v)) != CH_OK)
			return rc;
		r = emit(o, CH_OUT_CERTIFIED);
		r->link = w->link;
		r->gid = w->gid;
		r->local = w->local;
		r->ticket = w->ticket;
		r->origin = w->origin;
		r->ref = w->ref;
		r->xid = w->xid;
		r->last_seen = last_seen;
		r->v = v;
		if (o->outcomes != NULL && !w->link)
			ch_outcomes_record(o->outcomes, w->origin, w->xid, w->gid, v.kind == CH_CERT_OK);
	}
	if (v.kind != CH_CERT_OK)
	{
		o->st.stats.cert_failures++;
		if (w->local)
			o->st.stats.local_failed++;
		return CH_OK;
	}
	h.gid = w->gid;
	h.prev = o->st.last_certified;
	h.ticket = w->ticket;
	h.ref = w->ref;
	h.origin = w->origin;
	h.local = w->local;
	h.settle = 0;
	o->st.last_certified = w->gid;
	o->st.stats.certified++;
	h.link = w->link;
	/* (a link writeset's schema change is applied by the link's apply, not settled by reports) */
	if (!toi && !w->link && (w->flags & CHORUS_WS_FLAG_DDL) && !(w->flags & CHORUS_WS_FLAG_CONCURRENT))
	{
		int			opened = round != NULL ? round(arg, w->gid, w->origin) : 0;

		if (opened < 0)
			return CH_ECALLBACK;
		h.settle = opened > 0;
	}
	if (w->local)
		o->st.stats.local_certified++;
	else
		o->st.stats.remote_certified++;
	return hold(o, &h);
}

static int
reserve_packed(ch_order *o, size_t nkeys)
{
	if (nkeys > SIZE_MAX / 17)
		return CH_EFULL;
	return ch_grow(&o->mem, (void **) &o->packed, &o->packed_cap, 0, nkeys * 17, 1);
}

/* OrderCore.writeset and link_writeset */
static int
delivered(ch_order *o, uint32_t origin, int local, int link, int online, uint64_t ticket, uint64_t ref,
		  const uint8_t *buf, size_t len, ch_order_round_fn round, void *arg)
{
	ch_scan_info info;
	ord_ws		w;
	int			rc;

	if ((rc = begin(o, 4)) != CH_OK)
		return rc;
	if (!o->st.following || !o->st.quorate || !online)
	{
		if (local)
			emit(o, CH_OUT_LEFT)->ticket = ticket;
		return CH_OK;
	}
	rc = ch_scan(buf, len, &info, o->keys, o->keys_cap);
	if (rc == CH_EFULL)
	{
		if ((rc = ch_grow(&o->mem, (void **) &o->keys, &o->keys_cap, 0, info.nkeys, sizeof(ch_scan_key))) != CH_OK)
			return rc;
		rc = ch_scan(buf, len, &info, o->keys, o->keys_cap);
	}
	if (rc != CH_OK && rc != CH_EWIRE)
		return rc;
	if (rc == CH_OK && (rc = reserve_packed(o, info.nkeys)) != CH_OK)
		return rc;
	if (info.err == 0 && (o->st.ddl_open > 0 || o->def_head < o->def_len))
	{
		/* room to defer it: its place in the queue and its keys */
		if ((rc = queue_reserve(&o->mem, (void **) &o->def, &o->def_cap, &o->def_head, &o->def_len, 1,
								sizeof(ord_deferred))) != CH_OK)
			return rc;
	}
	/* its GID (OrderCore._next_gid) */
	o->st.gid++;
	o->st.stats.delivered++;
	if (info.err == 0 && link && (info.flags & (CHORUS_WS_FLAG_TOI | CHORUS_WS_FLAG_CONCURRENT)))
		info.err = -1;			/* a link carries a schema change as its content, never a request */
	if (info.err != 0)
	{
		ch_order_out *r = emit(o, CH_OUT_MALFORMED);

		r->link = link;
		o->st.stats.malformed++;
		o->st.stats.cert_failures++;
		r->gid = o->st.gid;
		r->local = local;
		r->ticket = ticket;
		r->ref = ref;
		r->scan_err = info.err;
		if (o->outcomes != NULL)
			ch_outcomes_seen(o->outcomes, o->st.gid);
		return CH_OK;
	}
	for (size_t i = 0; i < info.nkeys; i++)
	{
		memcpy(o->packed + 16 * i, o->keys[i].digest, 16);
		o->packed[16 * info.nkeys + i] = o->keys[i].mode;
	}
	w.gid = o->st.gid;
	w.ticket = ticket;
	w.ref = ref;
	w.last_seen = info.last_seen;
	w.origin = origin;
	w.xid = info.xid;
	w.local = local != 0;
	w.link = link != 0;
	w.flags = info.flags;
	w.nkeys = info.nkeys;
	w.digests = o->packed;
	w.modes = o->packed + 16 * info.nkeys;
	if (o->st.ddl_open > 0 || o->def_head < o->def_len)
	{
		/* a schema change before it has not reported its outcome: nothing after it is certified yet */
		ord_deferred *d = &o->def[o->def_len];
		void	   *keys = NULL;

		if (info.nkeys > 0 && (rc = ch_mem_resize(&o->mem, &keys, 0, info.nkeys * 17)) != CH_OK)
		{
			o->st.gid--;
			o->st.stats.delivered--;
			return rc;
		}
		if (info.nkeys > 0)
			memcpy(keys, o->packed, info.nkeys * 17);
		d->keys = keys;
		d->w = w;
		d->w.digests = keys;
		d->w.modes = d->keys + 16 * info.nkeys;
		o->def_len++;
		o->st.deferred++;
		if (o->outcomes != NULL)
			ch_outcomes_seen(o->outcomes, o->st.gid);
		return CH_OK;
	}
	if (o->outcomes != NULL)
		ch_outcomes_seen(o->outcomes, o->st.gid);
	return certify(o, &w, round, arg);
}

/*
 * ch_order_writeset
 *		OrderCore.writeset: the writeset of len bytes at buf, from origin
 *		(local: this node's, with its backend's ticket), delivered in total
 *		order; online: whether its origin is a member of the primary component
 *		at this place. ref is the caller's handle, given back with it.
 */
int
ch_order_writeset(ch_order *o, uint32_t origin, int local, int online, uint64_t ticket, uint64_t ref,
				  const uint8_t *buf, size_t len, ch_order_round_fn round, void *arg)
{
	return delivered(o, origin, local, 0, online, ticket, ref, buf, len, round, arg);
}

/*
 * ch_order_link_writeset
 *		OrderCore.link_writeset: a peer site's transaction, sent on by a
 *		receiver that is online (or not) at this place, certified under its
 *		link's origin as a blind write ordered at its GID. One that does not
 *		scan, or is an ordering request or a concurrent index change (MALFORMED
 *		with scan_err -1), fails.
 */
int
ch_order_link_writeset(ch_order *o, uint32_t origin, int online, uint64_t ref, const uint8_t *buf,
					   size_t len)
{
	return delivered(o, origin, 0, 1, online, 0, ref, buf, len, NULL, NULL);
}

/* Certify the deferred writesets until a schema change's outcome is open again. */
static int
certify_deferred(ch_order *o, ch_order_round_fn round, void *arg)
{
	while (o->def_head < o->def_len && o->st.ddl_open == 0)
	{
		ord_deferred d = o->def[o->def_head++];
		int			rc;

		o->st.deferred--;
		if (o->def_head == o->def_len)
			o->def_head = o->def_len = 0;
		rc = certify(o, &d.w, round, arg);
		drop_deferred(o, &d);
		if (rc != CH_OK)
			return rc;
	}
	return CH_OK;
}

/*
 * ch_order_ddl_settled
 *		OrderCore.ddl_settled: schema change gid's outcome is known; if it ran
 *		(ok) with content, its n keys are recorded. CH_ESTATE if gid is not
 *		an open schema change (the reference's KeyError).
 */
int
ch_order_ddl_settled(ch_order *o, uint64_t gid, int ok, int content, const uint8_t *digests,
					 const uint8_t *modes, size_t n, ch_order_round_fn round, void *arg)
{
	uint32_t	origin;
	size_t		i;
	int			settle = 0;
	int			rc;
	ch_order_out *r;

	if ((rc = begin(o, 4)) != CH_OK)
		return rc;
	for (i = 0; i < o->st.ddl_open && o->ddl[i].gid != gid; i++)
		;
	if (i == o->st.ddl_open)
		return CH_ESTATE;
	origin = o->ddl[i].node;
	if (ok && content)
	{
		int			opened;

		if ((rc = ch_cert_record(o->cert, gid, origin, digests, modes, n)) != CH_OK)
			return rc;
		memmove(o->ddl + i, o->ddl + i + 1, (o->st.ddl_open - i - 1) * sizeof(ord_pair));
		o->st.ddl_open--;
		opened = round != NULL ? round(arg, gid, origin) : 0;
		if (opened < 0)
			return CH_ECALLBACK;
		settle = opened > 0;
	}
	else
	{
		memmove(o->ddl + i, o->ddl + i + 1, (o->st.ddl_open - i - 1) * sizeof(ord_pair));
		o->st.ddl_open--;
	}
	r = emit(o, CH_OUT_DDL);
	r->gid = gid;
	r->settle = settle;
	r->origin = origin;
	return certify_deferred(o, round, arg);
}

int
ch_order_release(ch_order *o)
{
	int			rc;

	if ((rc = begin(o, 2)) != CH_OK)
		return rc;
	return release(o);
}

/*
 * ch_order_received
 *		OrderCore.received_report: bus node node reported it delivered up to
 *		gid; own: the report is this node's own (its last report is off the
 *		bus); in_view: its sender is in the view.
 */
int
ch_order_received(ch_order *o, uint32_t node, uint64_t gid, int own, int in_view)
{
	int			rc;

	if ((rc = begin(o, 2)) != CH_OK)
		return rc;
	if (in_view)
	{
		bool		found;
		uint64_t	had = pair_get(o->recv, o->recv_len, node, &found);

		if (!found && (rc = ch_grow(&o->mem, (void **) &o->recv, &o->recv_cap, o->recv_len, 1,
									sizeof(ord_pair))) != CH_OK)
			return rc;
		if (!found)
			o->recv[o->recv_len++] = (ord_pair) {node, gid};
		else
			for (size_t i = 0; i < o->recv_len; i++)
				if (o->recv[i].node == node)
					o->recv[i].gid = had > gid ? had : gid;
	}
	if (own)
		o->st.report_on_bus = 0;
	return o->st.following ? release(o) : CH_OK;
}

/* OrderCore.tick: a report on the bus since the last tick may have failed to send; report again. */
int
ch_order_tick(ch_order *o)
{
	int			rc;

	if ((rc = begin(o, 2)) != CH_OK)
		return rc;
	if (o->st.report_on_bus && (int64_t) o->st.reported == o->st.report_last_tick)
	{
		o->st.report_on_bus = 0;
		o->st.reported = 0;
	}
	o->st.report_last_tick = o->st.report_on_bus ? (int64_t) o->st.reported : -1;
	return release(o);
}

void
ch_order_set_votes(ch_order *o, uint32_t quorum, uint32_t expected, uint32_t tie_breaker)
{
	o->st.quorum = quorum;
	o->st.expected = expected;
	o->st.tie_breaker = tie_breaker;
}

/* OrderCore.view_changed: the new view's votes; reports count within one view. */
void
ch_order_view_changed(ch_order *o, uint32_t quorum, uint32_t expected, uint32_t tie_breaker)
{
	o->out_len = 0;
	ch_order_set_votes(o, quorum, expected, tie_breaker);
	o->recv_len = 0;
	o->st.reported = 0;
	o->st.report_on_bus = 0;
}

/* The GID each bus node joined the primary component at (Membership.joined_at). */
int
ch_order_set_joined(ch_order *o, const uint32_t *nodes, const uint64_t *gids, size_t n)
{
	int			rc;

	if ((rc = ch_grow(&o->mem, (void **) &o->joined, &o->joined_cap, 0, n, sizeof(ord_pair))) != CH_OK)
		return rc;
	for (size_t i = 0; i < n; i++)
		o->joined[i] = (ord_pair) {nodes[i], gids[i]};
	o->joined_len = n;
	return CH_OK;
}

/*
 * ch_order_install
 *		OrderCore.install: the node joins (or bootstraps) at gid, with what was
 *		certified and released there, the n certified writesets not released
 *		yet (gid, prev, local, link, ticket, origin, ref, settle of each) and the
 *		certification index cert.
 */
int
ch_order_install(ch_order *o, ch_cert *cert, uint64_t gid, uint64_t certified, uint64_t released,
				 const ch_order_out *unstable, size_t n)
{
	int			rc;

	o->out_len = 0;
	if ((rc = ch_grow(&o->mem, (void **) &o->held, &o->held_cap, 0, n, sizeof(ord_held))) != CH_OK)
		return rc;
	clear_deferred(o);
	for (size_t i = 0; i < n; i++)
	{
		const ch_order_out *u = &unstable[i];

		o->held[i] = (ord_held) {.gid = u->gid, .prev = u->prev, .ticket = u->ticket, .ref = u->ref,
			.origin = u->origin, .local = u->local != 0, .link = u->link != 0, .settle = u->settle != 0};
	}
	o->held_head = 0;
	o->held_len = n;
	o->st.held = n;
	o->st.gid = gid;
	o->st.last_certified = certified;
	o->st.released = released;
	o->st.ddl_open = 0;
	o->cert = cert;
	return CH_OK;
}

/*
 * ch_order_leave
 *		OrderCore.leave's order part: the held writesets and the deferred
 *		local ones are dropped, each local one as an UNKNOWN output, in order;
 *		the GID goes back to what was released.
 */
int
ch_order_leave(ch_order *o)
{
	size_t		more = o->def_len - o->def_head;
	int			rc;

	if ((rc = begin(o, more)) != CH_OK)
		return rc;
	for (size_t i = o->held_head; i < o->held_len; i++)
		if (o->held[i].local)
		{
			ch_order_out *r = emit(o, CH_OUT_UNKNOWN);

			r->gid = o->held[i].gid;
			r->ticket = o->held[i].ticket;
			r->ref = o->held[i].ref;
		}
	for (size_t i = o->def_head; i < o->def_len; i++)
		if (o->def[i].w.local)
		{
			ch_order_out *r = emit(o, CH_OUT_UNKNOWN);

			r->gid = o->def[i].w.gid;
			r->ticket = o->def[i].w.ticket;
			r->ref = o->def[i].w.ref;
		}
	o->held_head = o->held_len = 0;
	o->st.held = 0;
	clear_deferred(o);
	o->st.ddl_open = 0;
	o->st.gid = o->st.last_certified = o->st.released;
	return CH_OK;
}

/* The held writesets, oldest first, as RELEASE records (at most cap); returns how many there are. */
size_t
ch_order_unstable(const ch_order *o, ch_order_out *out, size_t cap)
{
	size_t		n = o->held_len - o->held_head;

	for (size_t i = 0; i < n && i < cap; i++)
		put_held(&out[i], &o->held[o->held_head + i]);
	return n;
}

size_t
ch_order_ddl_open(const ch_order *o, uint64_t *gids, uint32_t *origins, size_t cap)
{
	for (size_t i = 0; i < o->st.ddl_open && i < cap; i++)
	{
		gids[i] = o->ddl[i].gid;
		origins[i] = o->ddl[i].node;
	}
	return o->st.ddl_open;
}

size_t
ch_order_received_nodes(const ch_order *o, uint32_t *nodes, uint64_t *gids, size_t cap)
{
	for (size_t i = 0; i < o->recv_len && i < cap; i++)
	{
		nodes[i] = o->recv[i].node;
		gids[i] = o->recv[i].gid;
	}
	return o->recv_len;
}
