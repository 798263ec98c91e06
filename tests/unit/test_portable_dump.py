"""chorus.migrate.portable: a node's dump without Chorus's own entries (issue 35: a dump of a
node restores into a plain PostgreSQL), on the text pg_dump 15 writes."""

from __future__ import annotations

from chorus.migrate import portable

PLAIN = """--
-- PostgreSQL database dump
--

SET statement_timeout = 0;

--
-- Name: chorus; Type: SCHEMA; Schema: -; Owner: postgres
--

CREATE SCHEMA chorus;


ALTER SCHEMA chorus OWNER TO postgres;

--
-- Name: app; Type: SCHEMA; Schema: -; Owner: postgres
--

CREATE SCHEMA app;


--
-- Name: chorus; Type: EXTENSION; Schema: -; Owner: -
--

CREATE EXTENSION IF NOT EXISTS chorus WITH SCHEMA chorus;


--
-- Name: EXTENSION chorus; Type: COMMENT; Schema: -; Owner: 
--

COMMENT ON EXTENSION chorus IS 'Chorus: synchronous multi-master replication';


--
-- Name: t; Type: TABLE; Schema: app; Owner: postgres
--

CREATE TABLE app.t (
    id integer NOT NULL,
    note text
);


--
-- Data for Name: t; Type: TABLE DATA; Schema: app; Owner: postgres
--

COPY app.t (id, note) FROM stdin;
1\t--
2\tchorus
\\.


--
-- Name: SCHEMA chorus; Type: ACL; Schema: -; Owner: postgres
--

GRANT USAGE ON SCHEMA chorus TO PUBLIC;


--
-- PostgreSQL database dump complete
--

"""


def _without(text: str, *headers: str) -> str:
    """text less each entry whose header is one of headers: from its opening "--" line up to the
    next entry's."""
    for h in headers:
        start = text.index("--\n-- " + h)
        end = text.index("\n--\n-- ", start + 1) + 1
        text = text[:start] + text[end:]
    return text


def test_plain_leaves_out_chorus_entries_and_keeps_everything_else() -> None:
    out = "".join(portable.plain(PLAIN.splitlines(keepends=True)))
    assert out == _without(PLAIN, "Name: chorus; Type: SCHEMA", "Name: chorus; Type: EXTENSION",
                           "Name: EXTENSION chorus; Type: COMMENT", "Name: SCHEMA chorus; Type: ACL")
    assert "CREATE TABLE app.t" in out and "1\t--\n2\tchorus\n" in out and "chorus;" not in out


def test_plain_without_chorus_is_unchanged() -> None:
    text = PLAIN.replace("chorus", "other")
    assert "".join(portable.plain(text.splitlines(keepends=True))) == text


TOC = """;
; Archive created at 2026-11-27 12:25:01 UTC
;
6; 2615 16384 SCHEMA - chorus postgres
7; 2615 17000 SCHEMA - app postgres
2; 3079 16385 EXTENSION - chorus 
3696; 0 0 COMMENT - EXTENSION chorus 
3697; 0 0 ACL - SCHEMA chorus postgres
220; 1259 17001 TABLE app t postgres
3690; 0 17001 TABLE DATA app t postgres
221; 1259 17005 TABLE app chorus_like_name postgres
"""


def test_toc_leaves_out_chorus_entries() -> None:
    out = list(portable.toc(TOC.splitlines(keepends=True)))
    assert [ln.split(";")[0] for ln in out if not ln.startswith(";")] == ["7", "220", "3690", "221"]
