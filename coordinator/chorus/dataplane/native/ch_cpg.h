/*
 * ch_cpg.h
 *		Corosync's closed process group in C for the data path (bus_cpg.c;
 *		docs/NATIVE.md, "Step 2, first part"). One CPG member whose callbacks
 *		are C: cpg_dispatch(CS_DISPATCH_ALL) appends every delivered frame and
 *		every configuration change, in the order Corosync delivered them, to one
 *		buffer the member owns, which the caller reads whole after the call
 *		(one call per wake-up, not one Python callback per message). Sends
 *		(cpg_mcast_joined, agreed order) are C calls too.
 *
 *		Calls that reach Corosync return its cs_error_t (1 is CS_OK, 6
 *		CS_ERR_TRY_AGAIN); ch_cpg_dispatch returns CH_CPG_ENOMEM when a callback
 *		could not keep what it was given (the batch up to there stays whole).
 *
 *		The batch, in host byte order, one record after the other:
 *		  'D' u32 nodeid, u32 pid, u32 length, then the frame's bytes;
 *		  'V' u32 members, u32 left, u32 joined, then that many (u32 nodeid,
 *		      u32 pid) pairs: the members, those who left, those who joined.
 *
 *		This file is also part of the cffi declaration of the module
 *		(dataplane/build.py reads it, dropping the preprocessor lines).
 */
#ifndef CH_CPG_H
#define CH_CPG_H

#include <stddef.h>
#include <stdint.h>

typedef struct ch_cpg ch_cpg;

extern ch_cpg *ch_cpg_new(const char *group, size_t len);
extern void ch_cpg_free(ch_cpg *c);

extern int	ch_cpg_initialize(ch_cpg *c);
extern int	ch_cpg_local_get(ch_cpg *c, uint32_t *nodeid);
extern int	ch_cpg_max_msgsize(ch_cpg *c, uint32_t *size);
extern int	ch_cpg_fd(ch_cpg *c, int *fd);
extern int	ch_cpg_join(ch_cpg *c);
extern int	ch_cpg_leave(ch_cpg *c);
extern int	ch_cpg_finalize(ch_cpg *c);

extern int	ch_cpg_dispatch(ch_cpg *c);
extern const char *ch_cpg_batch(const ch_cpg *c, size_t *len);
extern void ch_cpg_batch_clear(ch_cpg *c);

extern int	ch_cpg_send(ch_cpg *c, const char *frame, size_t len);
extern int	ch_cpg_send_whole(ch_cpg *c, uint32_t seq, const char *payload, size_t len);

extern int	ch_cpg_rec_deliver(ch_cpg *c, uint32_t nodeid, uint32_t pid, const char *msg, size_t len);
extern int	ch_cpg_rec_confchg(ch_cpg *c, const uint32_t *members, size_t nmembers,
							   const uint32_t *left, size_t nleft,
							   const uint32_t *joined, size_t njoined);

#endif
