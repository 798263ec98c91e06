/*
 * chorus_stamp.c
 *		Row stamps of a site with links (docs/LINKS.md section 5): where
 *		chorus.link_site names this site, every committed writeset records,
 *		for each row key it certified, the site's clock (its GID) in
 *		chorus.link_stamp, in the same transaction and alike on every node: on
 *		its origin once the verdict gave it its GID (chorus_xact.c), on every
 *		other node in its apply (chorus_apply.c), where a run of writesets is
 *		refused (each needs its own GID). A stamp is keyed by the first 16 bytes
 *		of the SHA-256 of the key's parts, each as u32 length and bytes (as the
 *		writeset carries them; coordinator/chorus/link/settle.py's stamp_hash).
 *		A link writeset (it moves chorus.link_position) is not stamped here:
 *		the coordinator decided its stamps, which are rows of it.
 */
#include "postgres.h"

#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "datatype/timestamp.h"

#include "chorus_settings.h"
#include "chorus_stamp.h"
#include "chorus_wire.h"

#define STAMP_KEY_BYTES 16

static SPIPlanPtr chorus_stamp_plan = NULL;

static const char *const chorus_stamp_sql =
"INSERT INTO chorus.link_stamp AS s (key, site, clock, commit_time) "
"VALUES ($1, $2, $3, $4) "
"ON CONFLICT (key) DO UPDATE SET site = excluded.site, clock = excluded.clock, "
"commit_time = excluded.commit_time";

/*
 * chorus_apply_commit_time
 *		The origin commit time of the writeset the apply session applies:
 *		chorus.commit_time, which only a superuser sets (the coordinator, with
 *		each apply; docs/LINKS.md section 5.1). Read before any row is applied,
 *		so no code the apply runs can change what the stamps record. 0 when it
 *		is not set (a coordinator of a release before) or not a number.
 */
int64
chorus_apply_commit_time(void)
{
	const char *s = chorus_commit_time;
	char	   *end;
	long long	v;

	if (s == NULL || s[0] == '\0')
		return 0;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: chorus.commit_time \"%s\" is not a commit time (µs since the Unix epoch)", s)));
	return (int64) v;
}

/*
 * chorus_stamping
 *		Whether this node stamps rows: chorus.link_site is set.
 */
bool
chorus_stamping(void)
{
	return chorus_link_site != NULL && chorus_link_site[0] != '\0';
}

static bool
part_is(ChorusWsBytes p, const char *s)
{
	return p.len == strlen(s) && memcmp(p.data, s, p.len) == 0;
}

static void
stamp_refuse(const ChorusWsReader *r)
{
	ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
					errmsg("chorus: a writeset's keys cannot be read for its row stamps (error %d at byte %zu)",
						   (int) r->err, r->err_pos)));
}

/*
 * chorus_stamp_keys
 *		Read the nkeys keys at r (the end of a writeset) and stamp each key of
 *		a row (not a reference, not the extension's own tables) with gid, as
 *		the table's owner in a restricted security context. Nothing when this
 *		node does not stamp, or for a link writeset.
 */
void
chorus_stamp_keys(ChorusWsReader *r, uint32 nkeys, uint64 gid, int64 commit_time)
{
	bytea	  **hashes;
	int			n = 0;
	bool		link = false;
	uint32		i;
	Oid			nsp,
				relid,
				owner,
				save_user;
	int			save_sec;

	if (!chorus_stamping() || nkeys == 0)
		return;
	hashes = palloc(sizeof(bytea *) * nkeys);
	for (i = 0; i < nkeys; i++)
	{
		uint8_t		mode;
		uint16_t	nparts,
					k;
		pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
		uint8		digest[PG_SHA256_DIGEST_LENGTH];
		bool		own = false;

		if (chorus_wsr_key(r, &mode, &nparts) != 0)
			stamp_refuse(r);
		if (ctx == NULL || pg_cryptohash_init(ctx) < 0)
			elog(ERROR, "chorus: could not start a SHA-256 hash");
		for (k = 0; k < nparts; k++)
		{
			ChorusWsBytes p;
			uint8		len[4];

			if (chorus_wsr_key_part(r, &p) != 0)
				stamp_refuse(r);
			if (k == 0)
				own = part_is(p, "chorus");
			if (k == 1 && own && part_is(p, "link_position"))
				link = true;
			len[0] = (uint8) (p.len >> 24);
			len[1] = (uint8) (p.len >> 16);
			len[2] = (uint8) (p.len >> 8);
			len[3] = (uint8) p.len;
			if (pg_cryptohash_update(ctx, len, 4) < 0 ||
				pg_cryptohash_update(ctx, (const uint8 *) p.data, p.len) < 0)
				elog(ERROR, "chorus: could not hash a key");
		}
		if (pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
			elog(ERROR, "chorus: could not hash a key");
		pg_cryptohash_free(ctx);
		if (mode == CHORUS_KEY_REFERENCE || own || nparts < 2)
			continue;
		hashes[n] = palloc(VARHDRSZ + STAMP_KEY_BYTES);
		SET_VARSIZE(hashes[n], VARHDRSZ + STAMP_KEY_BYTES);
		memcpy(VARDATA(hashes[n]), digest, STAMP_KEY_BYTES);
		n++;
	}
	if (link || n == 0)
		return;

	nsp = get_namespace_oid("chorus", false);
	relid = get_relname_relid("link_stamp", nsp);
	if (!OidIsValid(relid))
		ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
						errmsg("chorus: chorus.link_stamp does not exist, but chorus.link_site is set"),
						errhint("ALTER EXTENSION chorus UPDATE, or unset chorus.link_site.")));
	{
		Relation	rel = table_open(relid, RowExclusiveLock);

		owner = rel->rd_rel->relowner;
		table_close(rel, NoLock);
	}
	GetUserIdAndSecContext(&save_user, &save_sec);
	SetUserIdAndSecContext(owner, save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	PG_TRY();
	{
		Datum		site = CStringGetTextDatum(chorus_link_site);
		bool		pushed = false;

		/* at PRE_COMMIT on the origin no statement holds a snapshot: take the transaction's */
		if (!ActiveSnapshotSet())
		{
			PushActiveSnapshot(GetTransactionSnapshot());
			pushed = true;
		}
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "chorus: SPI_connect failed");
		if (chorus_stamp_plan == NULL)
		{
			Oid			types[4] = {BYTEAOID, TEXTOID, INT8OID, TIMESTAMPTZOID};
			SPIPlanPtr	plan = SPI_prepare(chorus_stamp_sql, 4, types);

			if (plan == NULL)
				elog(ERROR, "chorus: preparing the row stamp statement failed: %s",
					 SPI_result_code_string(SPI_result));
			SPI_keepplan(plan);
			chorus_stamp_plan = plan;
		}
		for (i = 0; i < (uint32) n; i++)
		{
			Datum		values[4];
			int			rc;

			values[0] = PointerGetDatum(hashes[i]);
			values[1] = site;
			values[2] = Int64GetDatum((int64) gid);
			/* µs since the Unix epoch as a timestamptz (0, unknown: 'epoch') */
			values[3] = TimestampTzGetDatum((TimestampTz) commit_time -
											((POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY));
			rc = SPI_execute_plan(chorus_stamp_plan, values, NULL, false, 0);
			if (rc != SPI_OK_INSERT)
				elog(ERROR, "chorus: writing a row stamp failed: %s", SPI_result_code_string(rc));
		}
		SPI_finish();
		if (pushed)
			PopActiveSnapshot();	/* (after an error, the abort drops it) */
	}
	PG_FINALLY();
	{
		SetUserIdAndSecContext(save_user, save_sec);
	}
	PG_END_TRY();
}
