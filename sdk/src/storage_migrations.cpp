// Storage: the schema and its forward migrations (schema_version table).
#include "storage_p.h"
#include "storagesql_p.h"

#include "logging_p.h"

#include <im/types.h>

#include <QtCore/QDateTime>
#include <QtCore/QHash>
#include <QtCore/QSet>
#include <QtCore/QVariant>
#include <QtSql/QSqlError>
#include <QtSql/QSqlQuery>

#include <algorithm>

namespace im::detail {

namespace {

// Forward migrations. Index i upgrades the schema from version i to i + 1.
// Released entries are never edited; add a new one instead.
const QList<QStringList> &migrations() {
    static const QList<QStringList> steps = {
        // 0 -> 1
        {
            QStringLiteral("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)"),
            QStringLiteral(
                "CREATE TABLE outbox("
                " id INTEGER PRIMARY KEY AUTOINCREMENT,"
                " cmid TEXT NOT NULL UNIQUE,"
                " kind TEXT NOT NULL CHECK(kind IN ('send','recall')),"
                " conv TEXT NOT NULL,"
                " body TEXT,"
                " target INTEGER,"
                " created_at INTEGER NOT NULL,"
                " attempts INTEGER NOT NULL DEFAULT 0,"
                " last_error TEXT,"
                " next_retry_at INTEGER)"),
            QStringLiteral(
                "CREATE TABLE local_messages("
                " cmid TEXT PRIMARY KEY,"
                " kind TEXT NOT NULL,"
                " conv TEXT NOT NULL,"
                " body TEXT,"
                " target INTEGER,"
                " created_at INTEGER NOT NULL,"
                " state INTEGER NOT NULL,"
                " error_code TEXT,"
                " seq INTEGER,"
                " epoch INTEGER,"
                " dup INTEGER NOT NULL DEFAULT 0)"),
            QStringLiteral("CREATE INDEX local_messages_conv ON local_messages(conv, seq)"),
            QStringLiteral(
                "CREATE TABLE events("
                " conv TEXT NOT NULL,"
                " seq INTEGER NOT NULL,"
                " mid TEXT,"
                " kind TEXT NOT NULL,"
                " sender TEXT,"
                " body TEXT,"
                " ts INTEGER,"
                " epoch INTEGER,"
                " target INTEGER,"
                " user TEXT,"
                " PRIMARY KEY(conv, seq)) WITHOUT ROWID"),
            QStringLiteral("CREATE INDEX events_recall ON events(conv, target) WHERE kind = 'recall'"),
            QStringLiteral(
                "CREATE TABLE conversations("
                " conv TEXT PRIMARY KEY,"
                " kind TEXT,"
                " epoch INTEGER NOT NULL DEFAULT 0,"
                " after INTEGER NOT NULL DEFAULT 0,"
                " head INTEGER NOT NULL DEFAULT 0,"
                " delivered INTEGER NOT NULL DEFAULT 0,"
                " read INTEGER NOT NULL DEFAULT 0,"
                " unread INTEGER NOT NULL DEFAULT 0,"
                " min_seq INTEGER NOT NULL DEFAULT 1,"
                " gap_to INTEGER NOT NULL DEFAULT 0,"
                " read_pending INTEGER NOT NULL DEFAULT 0)"),
        },
        // 1 -> 2: history windows leave gaps, filled on demand
        {
            QStringLiteral("CREATE TABLE gaps(conv TEXT NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL,"
                           " PRIMARY KEY(conv, lo)) WITHOUT ROWID"),
        },
        // 2 -> 3: "is seq recalled?" must be an index lookup. SQLite's planner
        // never picked the partial index events_recall for it (it scanned the
        // conversation by primary key: one scan per row of every model read
        // and unread recount, cubic over a full sync; docs/benchmarks.md).
        {
            QStringLiteral("DROP INDEX events_recall"),
            QStringLiteral("CREATE INDEX events_recall_target ON events(conv, target, kind)"),
        },
        // 3 -> 4: own messages are matched by cmid (an event keeps its
        // sender's cmid); the unread badge is the server's count plus what
        // arrived above the head it was counted at (unread_head), never a
        // local recount; each draft names the credential it was written
        // under (owner), so it is never sent on another user's session.
        {
            QStringLiteral("ALTER TABLE events ADD COLUMN cmid TEXT"),
            QStringLiteral("CREATE INDEX events_cmid ON events(conv, cmid) WHERE cmid IS NOT NULL"),
            QStringLiteral("ALTER TABLE conversations ADD COLUMN unread_head INTEGER NOT NULL DEFAULT 0"),
            QStringLiteral("UPDATE conversations SET unread_head = head"),
            QStringLiteral("ALTER TABLE outbox ADD COLUMN owner TEXT"),
        },
        // 4 -> 5: replies, edits and reactions (contract section 12,
        // obligation 16). The outbox takes the kinds edit and react (its
        // CHECK cannot be altered: the table is rebuilt with its ids, so
        // creation order holds); events keep a msg's reply_to and its later
        // changes (the winning edit, the reaction counts as JSON, the seqs
        // they are known up to, recalled).
        {
            QStringLiteral(
                "CREATE TABLE outbox_v5("
                " id INTEGER PRIMARY KEY AUTOINCREMENT,"
                " cmid TEXT NOT NULL UNIQUE,"
                " kind TEXT NOT NULL CHECK(kind IN ('send','recall','edit','react')),"
                " conv TEXT NOT NULL,"
                " body TEXT,"
                " target INTEGER,"
                " created_at INTEGER NOT NULL,"
                " attempts INTEGER NOT NULL DEFAULT 0,"
                " last_error TEXT,"
                " next_retry_at INTEGER,"
                " owner TEXT,"
                " reply_to INTEGER,"
                " emoji TEXT,"
                " react_on INTEGER,"
                " target_cmid TEXT)"),
            QStringLiteral("INSERT INTO outbox_v5(id, cmid, kind, conv, body, target, created_at, attempts, last_error,"
                           " next_retry_at, owner) SELECT id, cmid, kind, conv, body, target, created_at, attempts,"
                           " last_error, next_retry_at, owner FROM outbox"),
            QStringLiteral("DROP TABLE outbox"),
            QStringLiteral("ALTER TABLE outbox_v5 RENAME TO outbox"),
            QStringLiteral("ALTER TABLE local_messages ADD COLUMN reply_to INTEGER"),
            QStringLiteral("ALTER TABLE events ADD COLUMN reply_to INTEGER"),
            QStringLiteral("ALTER TABLE events ADD COLUMN edit_seq INTEGER"),
            QStringLiteral("ALTER TABLE events ADD COLUMN edit_body TEXT"),
            QStringLiteral("ALTER TABLE events ADD COLUMN edit_ts INTEGER"),
            QStringLiteral("ALTER TABLE events ADD COLUMN reactions TEXT"),
            QStringLiteral("ALTER TABLE events ADD COLUMN reactions_seq INTEGER"),
            QStringLiteral("ALTER TABLE events ADD COLUMN recalled INTEGER NOT NULL DEFAULT 0"),
            QStringLiteral("ALTER TABLE events ADD COLUMN emoji TEXT"),
            QStringLiteral("ALTER TABLE events ADD COLUMN react_on INTEGER"),
        },
        // 5 -> 6: on-device search (obligation 18, storage_search.cpp). A
        // contentless FTS5 table (the text is in events already) over each
        // msg's current text, CJK runs as bigrams (searchtext_p.h), and a
        // token of its conversation (column conv); events.search_id is its
        // rowid there (ts * 2^20 + a free low part: rowid order is newest
        // first). A store that holds messages already gets its index built
        // in batches after the migration (meta search_build: the resume
        // key, 'done' when built).
        {
            QStringLiteral("ALTER TABLE events ADD COLUMN search_id INTEGER"),
            QStringLiteral("CREATE INDEX events_search ON events(search_id) WHERE search_id IS NOT NULL"),
            QStringLiteral("CREATE VIRTUAL TABLE search USING fts5(body, conv, content='', columnsize=0,"
                           " tokenize='unicode61 remove_diacritics 2')"),
            QStringLiteral("INSERT OR REPLACE INTO meta(key, value) VALUES('search_build',"
                           " CASE WHEN EXISTS(SELECT 1 FROM events WHERE kind = 'msg') THEN '' ELSE 'done' END)"),
            QStringLiteral("INSERT OR REPLACE INTO meta(key, value) VALUES('search_text_version', '1')"),
        },
        // 6 -> 7: the search index again, smaller and faster (issue 51's
        // targets; docs/benchmarks.md "On-device search"): search ids are
        // ts * 16 + a free low part (they were ts * 2^20 + low: each
        // doclist entry's rowid delta took 5 to 7 bytes), and the build
        // ends by merging the segments (meta search_build 'merge'). Built
        // anew in the background by the same resumable builder. And the
        // vocabulary search_terms (searchtext::vocabTerms()): a query's
        // last word, a prefix, is searched as the whole words it stands for.
        {
            QStringLiteral("DROP TABLE search"),
            QStringLiteral("DROP INDEX events_search"),
            QStringLiteral("UPDATE events SET search_id = NULL WHERE search_id IS NOT NULL"),
            QStringLiteral("CREATE INDEX events_search ON events(search_id) WHERE search_id IS NOT NULL"),
            QStringLiteral("CREATE VIRTUAL TABLE search USING fts5(body, conv, content='', columnsize=0,"
                           " tokenize='unicode61 remove_diacritics 2')"),
            QStringLiteral("INSERT OR REPLACE INTO meta(key, value) VALUES('search_build',"
                           " CASE WHEN EXISTS(SELECT 1 FROM events WHERE kind = 'msg') THEN '' ELSE 'done' END)"),
            QStringLiteral("DELETE FROM meta WHERE key IN ('search_build_done', 'search_build_total')"),
            QStringLiteral("INSERT OR REPLACE INTO meta(key, value) VALUES('search_text_version', '1')"),
            QStringLiteral("CREATE TABLE search_terms(term TEXT PRIMARY KEY) WITHOUT ROWID"),
        },
        // 7 -> 8: files ride the outbox (obligation 17). A send that carries
        // a file has a row here (its copy is <database>.files/outgoing/<cmid>):
        // what POST /v1/uploads announces, and the upload's att_id (kept
        // before the first PUT, so a restart resumes the same upload) and
        // whether the server said it is complete.
        {
            QStringLiteral("CREATE TABLE outbox_files("
                           " cmid TEXT PRIMARY KEY,"
                           " name TEXT NOT NULL,"
                           " mime TEXT NOT NULL,"
                           " size INTEGER NOT NULL,"
                           " sha256 TEXT NOT NULL,"
                           " att_id TEXT,"
                           " complete INTEGER NOT NULL DEFAULT 0)"),
        },
        // 8 -> 9: files received (obligation 17, contract section 12). A msg keeps its
        // `attachments` as JSON (the list the event carried) and their names
        // joined by newlines (att_names: the search index covers them,
        // storage_search.cpp); the table attachments knows every one by its
        // id, for download() (size and SHA-256 to check against).
        {
            QStringLiteral("ALTER TABLE events ADD COLUMN attachments TEXT"),
            QStringLiteral("ALTER TABLE events ADD COLUMN att_names TEXT"),
            QStringLiteral("CREATE TABLE attachments(att_id TEXT PRIMARY KEY, name TEXT NOT NULL, mime TEXT NOT NULL,"
                           " size INTEGER NOT NULL, sha256 TEXT NOT NULL) WITHOUT ROWID"),
        },
        // 9 -> 10: the search index merges its segments 16 at a time (FTS5's
        // automerge; it was 4). Every page's commit writes a segment and
        // FTS5 merges a level once it holds `automerge` of them, inside
        // that page's transaction: at 16 a row is rewritten about half as
        // often (log16 instead of log4 of the rows), a page of 200 costs
        // about 2 ms of CPU less on average at 1,000,000 messages, and the
        // slowest page's merge is a third (docs/benchmarks.md, issue 51).
        // A setting of the table: no rebuild.
        {
            QStringLiteral("INSERT INTO search(search, rank) VALUES('automerge', 16)"),
        },
    };
    return steps;
}

} // namespace

bool Storage::migrate() {
    if (!execSql(QStringLiteral(
            "CREATE TABLE IF NOT EXISTS schema_version(version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)")))
        return false;
    const int current = schemaVersion();
    if (current < 0)
        return false;
    if (current > SchemaVersion)
        return fail(QStringLiteral("database schema version %1 is newer than this SDK (%2)")
                        .arg(current)
                        .arg(SchemaVersion));
    const auto &steps = migrations();
    for (int v = current; v < SchemaVersion; ++v) {
        if (!begin())
            return false;
        for (const QString &sql : steps[v]) {
            if (!execSql(sql)) {
                const QString e = error_;
                rollback();
                return fail(QStringLiteral("migration %1 -> %2: %3").arg(v).arg(v + 1).arg(e));
            }
        }
        {
            QSqlQuery q(QSqlDatabase::database(connection_, false));
            q.prepare(QStringLiteral("INSERT INTO schema_version(version, applied_at) VALUES(?, ?)"));
            q.addBindValue(v + 1);
            q.addBindValue(QDateTime::currentMSecsSinceEpoch());
            if (!exec(q)) {
                const QString e = error_;
                q = QSqlQuery();
                rollback();
                return fail(e);
            }
        }
        if (!commit())
            return false;
    }
    return true;
}

int Storage::schemaVersion() {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT COALESCE(MAX(version), 0) FROM schema_version"));
    if (!exec(q) || !q.next())
        return -1;
    return q.value(0).toInt();
}

} // namespace im::detail
