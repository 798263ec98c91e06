/*
 * bus_cpg.c
 *		One CPG member with C callbacks, its deliveries and configuration
 *		changes gathered in one buffer per dispatch (ch_cpg.h). The port of
 *		bus/corosync.py's CorosyncBus data path; joining, quorum, reassembly of
 *		fragments and the views stay in that file, which reads the batch.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <corosync/corotypes.h>
#include <corosync/cpg.h>

#include "ch_cpg.h"

#define CH_CPG_ENOMEM (-3)
#define CH_CPG_HEADER 10		/* bus/fragment.py's HEADER: >BBII */
#define CH_CPG_KEEP (4u << 20)	/* a batch buffer larger than this is freed once read */

struct ch_cpg
{
	cpg_handle_t handle;
	struct cpg_name name;
	cpg_model_v1_data_t model;
	char	   *buf;
	size_t		len;
	size_t		cap;
	bool		oom;			/* a callback could not keep its record */
};

static bool
reserve(ch_cpg *c, size_t add)
{
	size_t		cap;
	char	   *p;

	if (c->oom)
		return false;
	if (add <= c->cap - c->len)
		return true;
	if (add > SIZE_MAX / 2 - c->len)
		return (c->oom = true, false);
	cap = c->cap ? c->cap : 64 * 1024;
	while (cap - c->len < add)
		cap *= 2;
	p = realloc(c->buf, cap);
	if (p == NULL)
		return (c->oom = true, false);
	c->buf = p;
	c->cap = cap;
	return true;
}

static void
put32(ch_cpg *c, uint32_t v)
{
	memcpy(c->buf + c->len, &v, 4);
	c->len += 4;
}

int
ch_cpg_rec_deliver(ch_cpg *c, uint32_t nodeid, uint32_t pid, const char *msg, size_t len)
{
	if (len > UINT32_MAX || !reserve(c, 13 + len))
		return (c->oom = true, CH_CPG_ENOMEM);
	c->buf[c->len++] = 'D';
	put32(c, nodeid);
	put32(c, pid);
	put32(c, (uint32_t) len);
	memcpy(c->buf + c->len, msg, len);
	c->len += len;
	return 0;
}

static void
put_pairs(ch_cpg *c, const uint32_t *pairs, size_t n)
{
	memcpy(c->buf + c->len, pairs, n * 8);
	c->len += n * 8;
}

int
ch_cpg_rec_confchg(ch_cpg *c, const uint32_t *members, size_t nmembers,
				   const uint32_t *left, size_t nleft,
				   const uint32_t *joined, size_t njoined)
{
	size_t		n = nmembers + nleft + njoined;

	if (n > UINT32_MAX / 8 || !reserve(c, 13 + n * 8))
		return (c->oom = true, CH_CPG_ENOMEM);
	c->buf[c->len++] = 'V';
	put32(c, (uint32_t) nmembers);
	put32(c, (uint32_t) nleft);
	put32(c, (uint32_t) njoined);
	put_pairs(c, members, nmembers);
	put_pairs(c, left, nleft);
	put_pairs(c, joined, njoined);
	return 0;
}

static ch_cpg *
member_of(cpg_handle_t handle)
{
	void	   *ctx = NULL;

	if (cpg_context_get(handle, &ctx) != CS_OK)
		return NULL;
	return ctx;
}

static void
on_deliver(cpg_handle_t handle, const struct cpg_name *group, uint32_t nodeid, uint32_t pid,
		   void *msg, size_t len)
{
	ch_cpg	   *c = member_of(handle);

	(void) group;
	if (c != NULL)
		ch_cpg_rec_deliver(c, nodeid, pid, msg, len);
}

/* (nodeid, pid) pairs of a cpg_address list, in a temporary array; NULL if none could be made */
static uint32_t *
pairs_of(const struct cpg_address *list, size_t n, uint32_t *one)
{
	uint32_t   *p = n <= 1 ? one : malloc(n * 8);

	if (p == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++)
	{
		p[2 * i] = list[i].nodeid;
		p[2 * i + 1] = list[i].pid;
	}
	return p;
}

static void
on_confchg(cpg_handle_t handle, const struct cpg_name *group,
		   const struct cpg_address *members, size_t nmembers,
		   const struct cpg_address *left, size_t nleft,
		   const struct cpg_address *joined, size_t njoined)
{
	ch_cpg	   *c = member_of(handle);
	uint32_t	one[3][2];
	uint32_t   *m,
			   *l,
			   *j;

	(void) group;
	if (c == NULL)
		return;
	m = pairs_of(members, nmembers, one[0]);
	l = pairs_of(left, nleft, one[1]);
	j = pairs_of(joined, njoined, one[2]);
	if (m == NULL || l == NULL || j == NULL)
		c->oom = true;
	else
		ch_cpg_rec_confchg(c, m, nmembers, l, nleft, j, njoined);
	if (m != one[0])
		free(m);
	if (l != one[1])
		free(l);
	if (j != one[2])
		free(j);
}

ch_cpg *
ch_cpg_new(const char *group, size_t len)
{
	ch_cpg	   *c;

	if (len == 0 || len > 127)
		return NULL;
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	c->name.length = (uint32_t) len;
	memcpy(c->name.value, group, len);
	c->model.model = CPG_MODEL_V1;
	c->model.cpg_deliver_fn = on_deliver;
	c->model.cpg_confchg_fn = on_confchg;
	c->model.cpg_totem_confchg_fn = NULL;
	c->model.flags = 0;
	return c;
}

void
ch_cpg_free(ch_cpg *c)
{
	if (c == NULL)
		return;
	ch_cpg_finalize(c);
	free(c->buf);
	free(c);
}

int
ch_cpg_initialize(ch_cpg *c)
{
	return cpg_model_initialize(&c->handle, CPG_MODEL_V1, (cpg_model_data_t *) &c->model, c);
}

int
ch_cpg_local_get(ch_cpg *c, uint32_t *nodeid)
{
	unsigned int id = 0;
	int			rc = cpg_local_get(c->handle, &id);

	*nodeid = id;
	return rc;
}

int
ch_cpg_max_msgsize(ch_cpg *c, uint32_t *size)
{
	return cpg_max_atomic_msgsize_get(c->handle, size);
}

int
ch_cpg_fd(ch_cpg *c, int *fd)
{
	return cpg_fd_get(c->handle, fd);
}

int
ch_cpg_join(ch_cpg *c)
{
	return cpg_join(c->handle, &c->name);
}

int
ch_cpg_leave(ch_cpg *c)
{
	return cpg_leave(c->handle, &c->name);
}

int
ch_cpg_finalize(ch_cpg *c)
{
	int			rc = CS_OK;

	if (c->handle != 0)
		rc = cpg_finalize(c->handle);
	c->handle = 0;
	return rc;
}

/*
 * Run every callback Corosync has ready. Their records are appended to the
 * batch (which the caller clears once it read it): what was delivered before
 * an error stays there, in order, as it did when each callback queued its own
 * event.
 */
int
ch_cpg_dispatch(ch_cpg *c)
{
	int			rc = cpg_dispatch(c->handle, CS_DISPATCH_ALL);

	return c->oom ? CH_CPG_ENOMEM : rc;
}

const char *
ch_cpg_batch(const ch_cpg *c, size_t *len)
{
	*len = c->len;
	return c->buf;
}

void
ch_cpg_batch_clear(ch_cpg *c)
{
	c->len = 0;
	if (c->cap > CH_CPG_KEEP)
	{
		free(c->buf);
		c->buf = NULL;
		c->cap = 0;
	}
}

int
ch_cpg_send(ch_cpg *c, const char *frame, size_t len)
{
	struct iovec iov = {(void *) frame, len};

	return cpg_mcast_joined(c->handle, CPG_TYPE_AGREED, &iov, 1);
}

/* A message in one frame: its header (bus/fragment.py's whole_frame) and the payload, not copied. */
int
ch_cpg_send_whole(ch_cpg *c, uint32_t seq, const char *payload, size_t len)
{
	unsigned char head[CH_CPG_HEADER] = {1, 3,
		(unsigned char) (seq >> 24), (unsigned char) (seq >> 16), (unsigned char) (seq >> 8), (unsigned char) seq,
	0, 0, 0, 0};
	struct iovec iov[2] = {{head, CH_CPG_HEADER}, {(void *) payload, len}};

	return cpg_mcast_joined(c->handle, CPG_TYPE_AGREED, iov, 2);
}
