/*
 * chorus_abort.h
 *		Abort slots (chorus_abort.c): the coordinator aborts a local transaction
 *		that holds a lock a certified remote writeset needs.
 */
#ifndef CHORUS_ABORT_H
#define CHORUS_ABORT_H

extern Size chorus_abort_shmem_size(void);
extern void chorus_abort_shmem_init(void);
extern uint64 chorus_abort_take(void);
extern void chorus_check_aborted(void);
extern void chorus_clear_aborted(void);
extern void chorus_protect_commit(void);

#endif							/* CHORUS_ABORT_H */
