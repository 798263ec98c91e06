/*
 * chorus_xact.h
 *		The transaction callbacks (chorus_xact.c).
 */
#ifndef CHORUS_XACT_H
#define CHORUS_XACT_H

extern void chorus_register_callbacks(void);

#endif							/* CHORUS_XACT_H */
