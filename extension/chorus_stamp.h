/*
 * chorus_stamp.h
 *		Row stamps of a site with links (chorus_stamp.c, docs/LINKS.md section 5).
 */
#ifndef CHORUS_STAMP_H
#define CHORUS_STAMP_H

#include "chorus_wsread.h"

extern bool chorus_stamping(void);
extern void chorus_stamp_keys(ChorusWsReader *r, uint32 nkeys, uint64 gid, int64 commit_time);
extern int64 chorus_apply_commit_time(void);

#endif							/* CHORUS_STAMP_H */
