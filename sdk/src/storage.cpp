#include "storage_p.h"

#include "logging_p.h"

#include <im/types.h>

#include <QtCore/QDateTime>
#include <QtCore/QDir>
#include <QtCore/QFileInfo>
#include <QtCore/QHash>
#include <QtCore/QSet>
#include <QtCore/QUuid>
#include <QtCore/QVariant>
#include <QtSql/QSqlError>
#include <QtSql/QSqlQuery>

#include <algorithm>
#include <atomic>

namespace im::detail {
namespace {

std::atomic<int> connectionCounter{0};

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
    };
    return steps;
}

QVariant nullIfEmpty(const QString &s) { return s.isNull() ? QVariant(QMetaType(QMetaType::QString)) : QVariant(s); }

} // namespace

Storage::Storage()
    : connection_(QStringLiteral("imsdk-%1").arg(connectionCounter.fetch_add(1))) {}

Storage::~Storage() { close(); }

bool Storage::fail(const QString &what) {
    error_ = what;
    return false;
}

bool Storage::open(const QString &path) {
    close();
    path_ = path;
    lockedByOther_ = false;
    const QFileInfo file(path);
    if (!QDir().mkpath(file.absolutePath()))
        return fail(QStringLiteral("cannot create the folder %1").arg(file.absolutePath()));
    // One process per store (obligation 10). The lock names its holder's pid;
    // a lock left by a process that died is taken over (QLockFile checks
    // whether that process still runs), never by age.
    lock_ = std::make_unique<QLockFile>(file.absoluteFilePath() + QStringLiteral(".lock"));
    lock_->setStaleLockTime(0);
    if (!lock_->tryLock(0)) {
        const QLockFile::LockError why = lock_->error();
        qint64 pid = 0;
        QString host, app;
        lock_->getLockInfo(&pid, &host, &app);
        lock_.reset();
        qCWarning(lcStorage, "store %s is locked by pid %lld", qUtf8Printable(path), static_cast<long long>(pid));
        if (why == QLockFile::LockFailedError) {
            lockedByOther_ = true;
            return fail(QStringLiteral("the store %1 is in use by another process (pid %2%3%4); "
                                       "one process at a time may open it")
                            .arg(path)
                            .arg(pid)
                            .arg(app.isEmpty() ? QString() : QStringLiteral(", ") + app)
                            .arg(host.isEmpty() ? QString() : QStringLiteral(" on ") + host));
        }
        return fail(QStringLiteral("cannot create the lock file %1.lock (permissions?)").arg(path));
    }
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), connection_);
        db.setDatabaseName(path);
        // The lock keeps other processes of ours out, so a busy database can
        // only be an outside tool holding it: wait briefly, then fail the
        // write (reported, retried later) instead of freezing the thread.
        db.setConnectOptions(QStringLiteral("QSQLITE_BUSY_TIMEOUT=%1").arg(BusyTimeoutMs));
        if (!db.open()) {
            const QString e = db.lastError().text();
            close();
            return fail(QStringLiteral("cannot open %1: %2").arg(path, e));
        }
    }
    open_ = true;
    // WAL + synchronous=FULL: a committed outbox row survives power loss.
    if (pragma(QStringLiteral("journal_mode=WAL")).compare(QLatin1String("wal"), Qt::CaseInsensitive) != 0) {
        close();
        return fail(QStringLiteral("cannot enable WAL journal mode on %1").arg(path));
    }
    if (!execSql(QStringLiteral("PRAGMA synchronous=FULL")) || !execSql(QStringLiteral("PRAGMA foreign_keys=ON"))
        || !appleFullFsync() || !migrate()) {
        const QString e = error_;
        close();
        return fail(e);
    }
    return true;
}

void Storage::close() {
    if (QSqlDatabase::contains(connection_)) {
        {
            QSqlDatabase db = QSqlDatabase::database(connection_, false);
            db.close();
        }
        QSqlDatabase::removeDatabase(connection_);
    }
    open_ = false;
    lock_.reset(); // unlocks
}

bool Storage::exec(QSqlQuery &q) {
    if (faultCountdown_ > 0 && --faultCountdown_ == 0)
        return fail(QStringLiteral("injected storage fault"));
    if (!q.exec())
        return fail(QStringLiteral("SQLite: %1 (%2)").arg(q.lastError().text(), q.lastQuery()));
    return true;
}

bool Storage::execSql(const QString &sql) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    if (!q.prepare(sql))
        return fail(QStringLiteral("SQLite prepare: %1 (%2)").arg(q.lastError().text(), sql));
    return exec(q);
}

bool Storage::appleFullFsync() {
#if defined(Q_OS_DARWIN)
    // On Apple systems fsync() only reaches the drive's cache; F_FULLFSYNC
    // reaches the platter. Without it a power cut can lose a "durable"
    // draft. checkpoint_fullfsync covers the WAL checkpoints as well.
    return execSql(QStringLiteral("PRAGMA fullfsync=ON")) && execSql(QStringLiteral("PRAGMA checkpoint_fullfsync=ON"));
#else
    return true;
#endif
}

bool Storage::begin(Durability durability) {
    if (!open_)
        return fail(QStringLiteral("database not open"));
    if (durability == Durability::Relaxed) {
        if (!execSql(QStringLiteral("PRAGMA synchronous=NORMAL"))) {
            durabilityUnknown_ = true; // the setting may have changed all the same
            return false;
        }
        relaxed_ = true;
    } else if (durabilityUnknown_) {
        // A relaxed write could not put synchronous=FULL back: this write
        // (an outbox row) must not be stored without a flush. Put it back
        // now, or fail the write.
        if (!execSql(QStringLiteral("PRAGMA synchronous=FULL")))
            return fail(QStringLiteral("cannot restore synchronous=FULL: %1").arg(error_));
        durabilityUnknown_ = false;
    }
    // IMMEDIATE: take the write lock up front so a busy database fails here,
    // not half way through a page.
    if (execSql(QStringLiteral("BEGIN IMMEDIATE")))
        return true;
    const QString e = error_;
    restoreDurability();
    return fail(e);
}

bool Storage::commit() {
    if (execSql(QStringLiteral("COMMIT"))) {
        restoreDurability();
        return true;
    }
    const QString e = error_;
    rollback();
    return fail(e);
}

void Storage::restoreDurability() {
    if (!relaxed_)
        return;
    relaxed_ = false;
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    if (!q.exec(QStringLiteral("PRAGMA synchronous=FULL"))) {
        // Not this write's failure (it needed no flush), but the next Full
        // one must not run under NORMAL: begin(Full) retries, or fails.
        durabilityUnknown_ = true;
        qCWarning(lcStorage, "cannot restore synchronous=FULL: %s", qUtf8Printable(q.lastError().text()));
    }
}

bool Storage::execRelaxed(QSqlQuery &q) {
    if (!begin(Durability::Relaxed))
        return false;
    if (exec(q)) {
        q.finish();
        return commit();
    }
    const QString e = error_;
    q.finish();
    rollback();
    return fail(e);
}

void Storage::rollback() {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.exec(QStringLiteral("ROLLBACK")); // no-op if no transaction is active
    restoreDurability();
}

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

std::optional<QString> Storage::meta(const QString &key) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT value FROM meta WHERE key = ?"));
    q.addBindValue(key);
    if (!exec(q))
        return std::nullopt;
    if (!q.next())
        return QString();
    return q.value(0).toString();
}

bool Storage::setMeta(const QString &key, const QString &value) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("INSERT INTO meta(key, value) VALUES(?, ?)"
                             " ON CONFLICT(key) DO UPDATE SET value = excluded.value"));
    q.addBindValue(key);
    q.addBindValue(value);
    return exec(q);
}

qint64 Storage::enqueue(const OutboxRow &row) {
    if (!begin())
        return 0;
    qint64 id = 0;
    {
        QSqlQuery q(QSqlDatabase::database(connection_, false));
        q.prepare(QStringLiteral("INSERT INTO outbox(cmid, kind, conv, body, target, created_at, owner)"
                                 " VALUES(?, ?, ?, ?, ?, ?, ?)"));
        q.addBindValue(row.cmid);
        q.addBindValue(row.kind);
        q.addBindValue(row.conv);
        q.addBindValue(nullIfEmpty(row.body));
        q.addBindValue(row.kind == u"recall" ? QVariant(row.target) : QVariant(QMetaType(QMetaType::LongLong)));
        q.addBindValue(row.createdAt);
        q.addBindValue(nullIfEmpty(row.owner));
        if (!exec(q)) { q = QSqlQuery(); rollback(); return 0; }
        id = q.lastInsertId().toLongLong();
        QSqlQuery m(QSqlDatabase::database(connection_, false));
        m.prepare(QStringLiteral("INSERT INTO local_messages(cmid, kind, conv, body, target, created_at, state)"
                                 " VALUES(?, ?, ?, ?, ?, ?, ?)"));
        m.addBindValue(row.cmid);
        m.addBindValue(row.kind);
        m.addBindValue(row.conv);
        m.addBindValue(nullIfEmpty(row.body));
        m.addBindValue(row.kind == u"recall" ? QVariant(row.target) : QVariant(QMetaType(QMetaType::LongLong)));
        m.addBindValue(row.createdAt);
        m.addBindValue(int(MessageState::Pending));
        if (!exec(m)) { q = QSqlQuery(); m = QSqlQuery(); rollback(); return 0; }
    }
    if (!commit())
        return 0;
    return id;
}

std::optional<QList<OutboxRow>> Storage::loadOutbox() {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT id, cmid, kind, conv, body, target, created_at, attempts, last_error,"
                             " next_retry_at, owner FROM outbox ORDER BY id"));
    if (!exec(q))
        return std::nullopt;
    QList<OutboxRow> rows;
    while (q.next()) {
        OutboxRow r;
        r.id = q.value(0).toLongLong();
        r.cmid = q.value(1).toString();
        r.kind = q.value(2).toString();
        r.conv = q.value(3).toString();
        r.body = q.value(4).toString();
        r.target = q.value(5).toLongLong();
        r.createdAt = q.value(6).toLongLong();
        r.attempts = q.value(7).toInt();
        r.lastError = q.value(8).toString();
        r.nextRetryAt = q.value(9).toLongLong();
        r.owner = q.value(10).toString();
        rows.append(r);
    }
    return rows;
}

bool Storage::rebindOutbox(const QString &from, const QString &to) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("UPDATE outbox SET owner = ? WHERE owner = ?"));
    q.addBindValue(to);
    q.addBindValue(from);
    return execRelaxed(q);
}

bool Storage::finishOutbox(const QString &cmid, int state, const QString &errorCode, qint64 seq, bool dup,
                           qint64 epoch) {
    if (!begin())
        return false;
    {
        QSqlQuery q(QSqlDatabase::database(connection_, false));
        q.prepare(QStringLiteral("DELETE FROM outbox WHERE cmid = ?"));
        q.addBindValue(cmid);
        if (!exec(q)) { q = QSqlQuery(); rollback(); return false; }
        QSqlQuery m(QSqlDatabase::database(connection_, false));
        m.prepare(QStringLiteral("UPDATE local_messages SET state = ?, error_code = ?, seq = ?, dup = ?, epoch = ?"
                                 " WHERE cmid = ?"));
        m.addBindValue(state);
        m.addBindValue(nullIfEmpty(errorCode));
        m.addBindValue(seq > 0 ? QVariant(seq) : QVariant(QMetaType(QMetaType::LongLong)));
        m.addBindValue(dup ? 1 : 0);
        m.addBindValue(epoch > 0 ? QVariant(epoch) : QVariant(QMetaType(QMetaType::LongLong)));
        m.addBindValue(cmid);
        if (!exec(m)) { q = QSqlQuery(); m = QSqlQuery(); rollback(); return false; }
    }
    return commit();
}

bool Storage::settleOutbox(const QList<Finish> &finished, const QList<Retry> &retries) {
    if (!begin(Durability::Relaxed))
        return false;
    {
        QSqlDatabase db = QSqlDatabase::database(connection_, false);
        QSqlQuery del(db), upd(db), retry(db);
        del.prepare(QStringLiteral("DELETE FROM outbox WHERE cmid = ?"));
        upd.prepare(QStringLiteral("UPDATE local_messages SET state = ?, error_code = ?, seq = ?, dup = ?, epoch = ?"
                                   " WHERE cmid = ?"));
        retry.prepare(QStringLiteral("UPDATE outbox SET attempts = ?, last_error = ?, next_retry_at = ? WHERE cmid = ?"));
        bool ok = true;
        for (const Finish &f : finished) {
            del.addBindValue(f.cmid);
            upd.addBindValue(f.state);
            upd.addBindValue(nullIfEmpty(f.errorCode));
            upd.addBindValue(f.seq > 0 ? QVariant(f.seq) : QVariant(QMetaType(QMetaType::LongLong)));
            upd.addBindValue(f.dup ? 1 : 0);
            upd.addBindValue(f.epoch > 0 ? QVariant(f.epoch) : QVariant(QMetaType(QMetaType::LongLong)));
            upd.addBindValue(f.cmid);
            if (!exec(del) || !exec(upd)) {
                ok = false;
                break;
            }
        }
        for (const Retry &r : retries) {
            if (!ok)
                break;
            retry.addBindValue(r.attempts);
            retry.addBindValue(r.lastError);
            retry.addBindValue(r.nextRetryAt);
            retry.addBindValue(r.cmid);
            ok = exec(retry);
        }
        if (!ok) {
            const QString e = error_;
            del = QSqlQuery();
            upd = QSqlQuery();
            retry = QSqlQuery();
            rollback();
            return fail(e);
        }
    }
    return commit();
}

bool Storage::markOnWire(const QList<QPair<QString, int>> &cmidAttempts) {
    if (cmidAttempts.isEmpty())
        return true;
    bool ok = begin(Durability::Relaxed);
    if (ok) {
        QSqlQuery q(QSqlDatabase::database(connection_, false));
        q.prepare(QStringLiteral("UPDATE outbox SET attempts = ? WHERE cmid = ?"));
        for (const auto &[cmid, attempts] : cmidAttempts) {
            q.addBindValue(attempts);
            q.addBindValue(cmid);
            if (!exec(q)) {
                ok = false;
                break;
            }
        }
        if (!ok) {
            const QString e = error_;
            q = QSqlQuery();
            rollback();
            fail(e);
        }
    }
    return ok && commit();
}

bool Storage::cancelOutbox(const QString &cmid) {
    if (!begin())
        return false;
    {
        QSqlQuery q(QSqlDatabase::database(connection_, false));
        q.prepare(QStringLiteral("DELETE FROM outbox WHERE cmid = ?"));
        q.addBindValue(cmid);
        QSqlQuery m(QSqlDatabase::database(connection_, false));
        m.prepare(QStringLiteral("DELETE FROM local_messages WHERE cmid = ?"));
        m.addBindValue(cmid);
        if (!exec(q) || !exec(m)) {
            const QString e = error_;
            q = QSqlQuery();
            m = QSqlQuery();
            rollback();
            return fail(e);
        }
    }
    return commit();
}

bool Storage::discardMessage(const QString &cmid, bool *found) {
    *found = false;
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("DELETE FROM local_messages WHERE cmid = ? AND state IN (?, ?)"
                             " AND NOT EXISTS(SELECT 1 FROM outbox o WHERE o.cmid = local_messages.cmid)"));
    q.addBindValue(cmid);
    q.addBindValue(int(MessageState::Failed));
    q.addBindValue(int(MessageState::Expired));
    if (!exec(q))
        return false;
    *found = q.numRowsAffected() > 0;
    return true;
}

bool Storage::recordRetry(const QString &cmid, int attempts, const QString &lastError, qint64 nextRetryAt) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("UPDATE outbox SET attempts = ?, last_error = ?, next_retry_at = ? WHERE cmid = ?"));
    q.addBindValue(attempts);
    q.addBindValue(lastError);
    q.addBindValue(nextRetryAt);
    q.addBindValue(cmid);
    return exec(q);
}

std::optional<LocalMessage> Storage::localMessage(const QString &cmid) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT cmid, kind, conv, body, target, state, error_code, seq, dup"
                             " FROM local_messages WHERE cmid = ?"));
    q.addBindValue(cmid);
    if (!exec(q) || !q.next())
        return std::nullopt;
    LocalMessage m;
    m.cmid = q.value(0).toString();
    m.kind = q.value(1).toString();
    m.conv = q.value(2).toString();
    m.body = q.value(3).toString();
    m.target = q.value(4).toLongLong();
    m.state = q.value(5).toInt();
    m.errorCode = q.value(6).toString();
    m.seq = q.value(7).toLongLong();
    m.dup = q.value(8).toBool();
    return m;
}

static ConvRow readConv(const QSqlQuery &q) {
    ConvRow c;
    c.conv = q.value(0).toString();
    c.kind = q.value(1).toString();
    c.epoch = q.value(2).toLongLong();
    c.after = q.value(3).toLongLong();
    c.head = q.value(4).toLongLong();
    c.delivered = q.value(5).toLongLong();
    c.read = q.value(6).toLongLong();
    c.unread = q.value(7).toLongLong();
    c.minSeq = q.value(8).toLongLong();
    c.gapTo = q.value(9).toLongLong();
    c.readPending = q.value(10).toLongLong();
    c.lastTs = q.value(11).toLongLong();
    return c;
}

static const QString convColumns = QStringLiteral(
    "c.conv, c.kind, c.epoch, c.after, c.head, c.delivered, c.read, c.unread, c.min_seq, c.gap_to,"
    " c.read_pending, (SELECT e.ts FROM events e WHERE e.conv = c.conv ORDER BY e.seq DESC LIMIT 1)");

std::optional<ConvRow> Storage::conversation(const QString &conv) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT %1 FROM conversations c WHERE c.conv = ?").arg(convColumns));
    q.addBindValue(conv);
    if (!exec(q) || !q.next())
        return std::nullopt;
    return readConv(q);
}

std::optional<QList<ConvRow>> Storage::conversations() {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT %1 FROM conversations c ORDER BY 12 DESC, c.conv").arg(convColumns));
    if (!exec(q))
        return std::nullopt;
    QList<ConvRow> rows;
    while (q.next())
        rows.append(readConv(q));
    return rows;
}

std::optional<QHash<QString, Cursor>> Storage::cursors() {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT conv, after, epoch FROM conversations"));
    if (!exec(q))
        return std::nullopt;
    QHash<QString, Cursor> out;
    while (q.next())
        out.insert(q.value(0).toString(), Cursor{q.value(1).toLongLong(), q.value(2).toLongLong()});
    return out;
}

bool Storage::upsertConversations(const QList<proto::ConvInfo> &convs) {
    const std::optional<QString> self = meta(QStringLiteral("user"));
    if (!self)
        return false;
    if (!begin(Durability::Relaxed))
        return false;
    for (const proto::ConvInfo &c : convs) {
        QSqlQuery q(QSqlDatabase::database(connection_, false));
        // The server's markers never go down; neither do ours. The unread
        // badge is the server's count (the one source of truth: it sees the
        // events inside our gaps), plus the events we applied above the head
        // it was counted at (pushes that overtook this answer); those are
        // counted once more only as they arrive (unread_head).
        q.prepare(QStringLiteral(
            "INSERT INTO conversations(conv, kind, head, delivered, read, unread, unread_head, min_seq)"
            " VALUES(:conv, :kind, :head, :delivered, :read, :unread, :head, :min_seq)"
            " ON CONFLICT(conv) DO UPDATE SET kind = excluded.kind, head = MAX(head, excluded.head),"
            " delivered = MAX(delivered, excluded.delivered), read = MAX(read, excluded.read),"
            " unread = excluded.unread + (SELECT COUNT(*) FROM events e WHERE e.conv = excluded.conv"
            "  AND e.seq > excluded.head AND e.seq > MAX(conversations.read, excluded.read) AND e.kind = 'msg'"
            "  AND e.sender IS NOT :self"
            "  AND NOT EXISTS(SELECT 1 FROM events r WHERE r.conv = e.conv AND r.kind = 'recall' AND r.target = e.seq)),"
            " unread_head = MAX(excluded.head, conversations.after),"
            " min_seq = MAX(min_seq, excluded.min_seq)"));
        q.bindValue(QStringLiteral(":self"), *self);
        q.bindValue(QStringLiteral(":conv"), c.conv);
        q.bindValue(QStringLiteral(":kind"), c.kind);
        q.bindValue(QStringLiteral(":head"), c.head);
        q.bindValue(QStringLiteral(":delivered"), c.delivered);
        q.bindValue(QStringLiteral(":read"), c.read);
        q.bindValue(QStringLiteral(":unread"), c.unread);
        q.bindValue(QStringLiteral(":min_seq"), c.minSeq);
        if (!exec(q)) { q = QSqlQuery(); rollback(); return false; }
    }
    return commit();
}

bool Storage::ensureConversation(const QString &conv) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("INSERT OR IGNORE INTO conversations(conv) VALUES(?)"));
    q.addBindValue(conv);
    return execRelaxed(q);
}

bool Storage::insertEvent(const proto::Event &e, qint64 epoch) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    // Keyed by (conv, seq): re-applying is harmless (events are immutable on
    // the server; REPLACE also heals a rebuild after CURSOR_AHEAD).
    q.prepare(QStringLiteral("INSERT OR REPLACE INTO events(conv, seq, mid, kind, sender, body, ts, epoch, target, user, cmid)"
                             " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
    q.addBindValue(e.conv);
    q.addBindValue(e.seq);
    q.addBindValue(e.mid);
    q.addBindValue(e.kind);
    q.addBindValue(nullIfEmpty(e.sender));
    q.addBindValue(nullIfEmpty(e.body));
    q.addBindValue(e.ts);
    q.addBindValue(epoch);
    q.addBindValue(e.kind == u"recall" ? QVariant(e.target) : QVariant(QMetaType(QMetaType::LongLong)));
    q.addBindValue(nullIfEmpty(e.user));
    q.addBindValue(e.cmid.isEmpty() ? QVariant(QMetaType(QMetaType::QString)) : QVariant(e.cmid));
    return !eventInsertFault() && exec(q);
}

bool Storage::countArrivals(const QString &conv, const QList<proto::Event> &events) {
    // No recount: only the events above unread_head (the highest seq the
    // badge already accounts for) change it, by what they are. Index
    // lookups only, whatever the length of the conversation.
    if (events.isEmpty())
        return true;
    const std::optional<QString> self = meta(QStringLiteral("user"));
    if (!self)
        return false;
    QSqlDatabase db = QSqlDatabase::database(connection_, false);
    QSqlQuery c(db);
    c.prepare(QStringLiteral("SELECT read, unread_head FROM conversations WHERE conv = ?"));
    c.addBindValue(conv);
    if (!exec(c))
        return false;
    if (!c.next())
        return true;
    const qint64 read = c.value(0).toLongLong();
    const qint64 counted = c.value(1).toLongLong();
    c.finish();
    qint64 delta = 0, top = counted;
    QSqlQuery t(db);
    t.prepare(QStringLiteral("SELECT 1 FROM events WHERE conv = ? AND seq = ? AND kind = 'msg' AND sender IS NOT ?"));
    for (const proto::Event &e : events) {
        if (e.seq <= counted)
            continue;
        top = std::max(top, e.seq);
        if (e.seq <= read)
            continue;
        if (e.kind == u"msg" && e.sender != *self) {
            ++delta;
        } else if (e.kind == u"recall" && e.target > read) {
            // The recalled message was counted if it is another's message.
            t.addBindValue(conv);
            t.addBindValue(e.target);
            t.addBindValue(*self);
            if (!exec(t))
                return false;
            if (t.next())
                --delta;
            t.finish();
        }
    }
    QSqlQuery u(db);
    u.prepare(QStringLiteral("UPDATE conversations SET unread = MAX(0, unread + ?), unread_head = ? WHERE conv = ?"));
    u.addBindValue(delta);
    u.addBindValue(top);
    u.addBindValue(conv);
    return exec(u);
}

bool Storage::startRebuild(const QString &conv, qint64 head) {
    QSqlDatabase db = QSqlDatabase::database(connection_, false);
    QSqlQuery q(db);
    q.prepare(QStringLiteral("INSERT OR IGNORE INTO conversations(conv) VALUES(?)"));
    q.addBindValue(conv);
    if (!exec(q))
        return false;
    q.prepare(QStringLiteral("SELECT epoch FROM conversations WHERE conv = ?"));
    q.addBindValue(conv);
    if (!exec(q) || !q.next())
        return false;
    const bool rebuilding = q.value(0).toLongLong() == 0;
    q.finish();
    if (!rebuilding)
        return true;
    // No cursor (new here, or dropped after CURSOR_AHEAD): the server's head
    // is the truth. What we hold above it the server no longer has (restored
    // from a backup); our old head must not keep asking for it.
    for (const QString &sql : {QStringLiteral("DELETE FROM events WHERE conv = :conv AND seq > :head"),
                               QStringLiteral("DELETE FROM gaps WHERE conv = :conv AND lo > :head"),
                               QStringLiteral("UPDATE conversations SET head = :head WHERE conv = :conv")}) {
        q.prepare(sql);
        q.bindValue(QStringLiteral(":conv"), conv);
        q.bindValue(QStringLiteral(":head"), head);
        if (!exec(q))
            return false;
    }
    return true;
}

bool Storage::applyPage(const proto::Page &page) {
    if (!begin(Durability::Relaxed))
        return false;
    auto abort = [this]() {
        const QString e = error_;
        rollback();
        return fail(e);
    };
    if (!startRebuild(page.conv, page.head))
        return abort();
    for (const proto::Event &e : page.events)
        if (!insertEvent(e, e.epoch > 0 ? e.epoch : page.epoch))
            return abort();
    {
        QSqlQuery q(QSqlDatabase::database(connection_, false));
        q.prepare(QStringLiteral(
            "UPDATE conversations SET after = MAX(after, :after), epoch = :epoch, head = MAX(head, :head),"
            " min_seq = :min_seq, gap_to = CASE WHEN :trimmed THEN MAX(gap_to, :min_seq - 1) ELSE gap_to END"
            " WHERE conv = :conv"));
        q.bindValue(QStringLiteral(":after"), page.nextAfter);
        q.bindValue(QStringLiteral(":epoch"), page.epoch);
        q.bindValue(QStringLiteral(":head"), page.head);
        q.bindValue(QStringLiteral(":min_seq"), page.minSeq);
        q.bindValue(QStringLiteral(":trimmed"), page.trimmed ? 1 : 0);
        q.bindValue(QStringLiteral(":conv"), page.conv);
        if (!exec(q)) { q = QSqlQuery(); return abort(); }
    }
    if (!countArrivals(page.conv, page.events))
        return abort();
    return commit();
}

bool Storage::applyPushedEvent(const proto::Event &ev, bool *applied) {
    *applied = false;
    if (!begin())
        return false;
    auto abort = [this]() {
        const QString e = error_;
        rollback();
        return fail(e);
    };
    {
        QSqlQuery c(QSqlDatabase::database(connection_, false));
        c.prepare(QStringLiteral("SELECT after, epoch FROM conversations WHERE conv = ?"));
        c.addBindValue(ev.conv);
        if (!exec(c)) { c = QSqlQuery(); return abort(); }
        if (!c.next() || c.value(1).toLongLong() == 0 || c.value(1).toLongLong() != ev.epoch
            || ev.seq != c.value(0).toLongLong() + 1) {
            c = QSqlQuery();
            rollback();
            return true; // not the next one: the caller syncs instead
        }
    }
    if (!insertEvent(ev, ev.epoch))
        return abort();
    {
        QSqlQuery u(QSqlDatabase::database(connection_, false));
        u.prepare(QStringLiteral("UPDATE conversations SET after = :seq, head = MAX(head, :seq) WHERE conv = :conv"));
        u.bindValue(QStringLiteral(":seq"), ev.seq);
        u.bindValue(QStringLiteral(":conv"), ev.conv);
        if (!exec(u)) { u = QSqlQuery(); return abort(); }
    }
    if (!countArrivals(ev.conv, {ev}))
        return abort();
    if (!commit())
        return false;
    *applied = true;
    return true;
}

bool Storage::applyPushedEvents(const QList<proto::Event> &events, QList<bool> *applied) {
    applied->fill(false, events.size());
    if (!begin(Durability::Relaxed))
        return false;
    struct Cursor { qint64 after = 0, epoch = 0; };
    QHash<QString, Cursor> cursors;
    QHash<QString, QList<proto::Event>> touched;
    bool ok = true;
    {
        QSqlDatabase db = QSqlDatabase::database(connection_, false);
        QSqlQuery c(db), u(db);
        c.prepare(QStringLiteral("SELECT after, epoch FROM conversations WHERE conv = ?"));
        u.prepare(QStringLiteral("UPDATE conversations SET after = :seq, head = MAX(head, :seq) WHERE conv = :conv"));
        for (qsizetype i = 0; ok && i < events.size(); ++i) {
            const proto::Event &ev = events.at(i);
            auto it = cursors.find(ev.conv);
            if (it == cursors.end()) {
                c.addBindValue(ev.conv);
                if (!exec(c)) {
                    ok = false;
                    break;
                }
                Cursor cur{-1, 0};
                if (c.next())
                    cur = Cursor{c.value(0).toLongLong(), c.value(1).toLongLong()};
                c.finish();
                it = cursors.insert(ev.conv, cur);
            }
            if (it->after < 0 || it->epoch == 0 || it->epoch != ev.epoch || ev.seq != it->after + 1)
                continue; // not the next one: the caller syncs instead
            if (!insertEvent(ev, ev.epoch)) {
                ok = false;
                break;
            }
            u.bindValue(QStringLiteral(":seq"), ev.seq);
            u.bindValue(QStringLiteral(":conv"), ev.conv);
            if (!exec(u)) {
                ok = false;
                break;
            }
            it->after = ev.seq;
            touched[ev.conv].append(ev);
            (*applied)[i] = true;
        }
    }
    for (auto t = touched.cbegin(); ok && t != touched.cend(); ++t)
        ok = countArrivals(t.key(), t.value());
    if (!ok) {
        const QString e = error_;
        rollback();
        applied->fill(false, events.size());
        return fail(e);
    }
    if (!commit()) {
        applied->fill(false, events.size());
        return false;
    }
    return true;
}

bool Storage::resetConversation(const QString &conv, bool dropEvents) {
    if (!begin(Durability::Relaxed))
        return false;
    {
        if (dropEvents) {
            QSqlQuery d(QSqlDatabase::database(connection_, false));
            d.prepare(QStringLiteral("DELETE FROM events WHERE conv = ?"));
            d.addBindValue(conv);
            if (!exec(d)) { d = QSqlQuery(); rollback(); return false; }
        }
        {
            QSqlQuery g(QSqlDatabase::database(connection_, false));
            g.prepare(QStringLiteral("DELETE FROM gaps WHERE conv = ?"));
            g.addBindValue(conv);
            if (!exec(g)) { g = QSqlQuery(); rollback(); return false; }
        }
        QSqlQuery q(QSqlDatabase::database(connection_, false));
        q.prepare(dropEvents
                      ? QStringLiteral("UPDATE conversations SET after = 0, epoch = 0, head = 0, gap_to = 0 WHERE conv = ?")
                      : QStringLiteral("UPDATE conversations SET after = 0, epoch = 0 WHERE conv = ?"));
        q.addBindValue(conv);
        if (!exec(q)) { q = QSqlQuery(); rollback(); return false; }
    }
    return commit();
}

bool Storage::setDelivered(const QString &conv, qint64 delivered) {
    if (!begin(Durability::Relaxed))
        return false;
    {
        QSqlQuery q(QSqlDatabase::database(connection_, false));
        q.prepare(QStringLiteral("UPDATE conversations SET delivered = MAX(delivered, ?) WHERE conv = ?"));
        q.addBindValue(delivered);
        q.addBindValue(conv);
        if (!exec(q)) {
            const QString e = error_;
            q = QSqlQuery();
            rollback();
            return fail(e);
        }
    }
    return commit();
}

bool Storage::setRead(const QString &conv, qint64 read) {
    // Read up to what the badge accounts for: nothing is unread. Read part of
    // the way: the badge stays until the server's count comes (the caller
    // refreshes `convs`); it is never recounted locally.
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("UPDATE conversations SET read = MAX(read, :read),"
                             " read_pending = CASE WHEN read_pending <= :read THEN 0 ELSE read_pending END,"
                             " unread = CASE WHEN :read >= unread_head THEN 0 ELSE unread END"
                             " WHERE conv = :conv"));
    q.bindValue(QStringLiteral(":read"), read);
    q.bindValue(QStringLiteral(":conv"), conv);
    return execRelaxed(q);
}

bool Storage::setReadPending(const QString &conv, qint64 seq) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("UPDATE conversations SET read_pending = MAX(read_pending, ?) WHERE conv = ?"));
    q.addBindValue(seq);
    q.addBindValue(conv);
    return execRelaxed(q);
}

bool Storage::updateHead(const QString &conv, qint64 head) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("UPDATE conversations SET head = MAX(head, ?) WHERE conv = ?"));
    q.addBindValue(head);
    q.addBindValue(conv);
    return execRelaxed(q);
}

bool Storage::resetInstallState(const QString &newInstallId) {
    if (!begin())
        return false;
    for (const QString &sql : {QStringLiteral("DELETE FROM events"), QStringLiteral("DELETE FROM conversations"),
                               QStringLiteral("DELETE FROM gaps"),
                               QStringLiteral("DELETE FROM meta WHERE key = 'install_stale'")}) {
        if (!execSql(sql)) { rollback(); return false; }
    }
    if (!setMeta(QStringLiteral("install_id"), newInstallId)) {
        rollback();
        return false;
    }
    return commit();
}

std::optional<QList<MessageRow>> Storage::messages(const QString &conv, const QString &self, qint64 from) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral(
        "SELECT * FROM ("
        " SELECT e.seq AS pos, e.seq AS seq, e.kind AS kind, e.sender AS sender, e.body AS body, e.ts AS ts, lm.cmid AS cmid,"
        "  lm.state AS state, lm.error_code AS error_code, COALESCE(lm.dup, 0) AS dup,"
        "  EXISTS(SELECT 1 FROM events r WHERE r.conv = e.conv AND r.kind = 'recall' AND r.target = e.seq) AS recalled,"
        "  e.user AS user, (lm.cmid IS NOT NULL OR e.sender = :self) AS own"
        // Ours by the cmid the event carries (a seq can name another's
        // message after an epoch change or a restore); an event stored
        // before schema 4 has none and falls back to (seq, epoch), ours only.
        " FROM events e LEFT JOIN local_messages lm"
        "  ON lm.cmid = COALESCE(e.cmid, (SELECT l2.cmid FROM local_messages l2 WHERE l2.conv = e.conv"
        "   AND l2.seq = e.seq AND l2.epoch = e.epoch AND l2.kind = 'send'))"
        "  AND lm.conv = e.conv AND lm.kind = 'send' AND e.sender = :self"
        " WHERE e.conv = :conv AND e.seq >= :from AND e.kind <> 'recall'"
        " UNION ALL"
        " SELECT CASE WHEN lm.seq IS NOT NULL THEN lm.seq WHEN lm.state = :pending THEN 9.0e18"
        "  ELSE COALESCE((SELECT MAX(e3.seq) FROM events e3 WHERE e3.conv = lm.conv AND e3.ts <= lm.created_at), 0)"
        "   + 0.5 END,"
        "  lm.seq, 'msg', :self, lm.body, lm.created_at, lm.cmid, lm.state, lm.error_code, lm.dup, 0, NULL, 1"
        " FROM local_messages lm LEFT JOIN conversations c ON c.conv = lm.conv"
        " WHERE lm.conv = :conv AND lm.kind = 'send' AND (lm.seq IS NULL OR ("
        "  (c.epoch IS NULL OR c.epoch = 0 OR lm.epoch = c.epoch)"
        "  AND NOT EXISTS(SELECT 1 FROM events e2 WHERE e2.conv = lm.conv AND e2.sender = :self"
        "   AND (e2.cmid = lm.cmid OR (e2.cmid IS NULL AND e2.seq = lm.seq)))))"
        ") WHERE pos >= :from ORDER BY pos, ts"));
    q.bindValue(QStringLiteral(":conv"), conv);
    q.bindValue(QStringLiteral(":from"), from);
    q.bindValue(QStringLiteral(":self"), self);
    q.bindValue(QStringLiteral(":pending"), int(MessageState::Pending));
    if (!exec(q))
        return std::nullopt;
    QList<MessageRow> rows;
    while (q.next()) {
        MessageRow r;
        r.pos = q.value(0).toDouble();
        r.seq = q.value(1).toLongLong();
        r.kind = q.value(2).toString();
        r.sender = q.value(3).toString();
        r.body = q.value(4).toString();
        r.ts = q.value(5).toLongLong();
        r.cmid = q.value(6).toString();
        r.state = q.value(7).isNull() ? int(MessageState::Sent) : q.value(7).toInt();
        r.errorCode = q.value(8).toString();
        r.dup = q.value(9).toBool();
        if (q.value(10).toBool())
            r.state = int(MessageState::Recalled);
        r.user = q.value(11).toString();
        r.own = q.value(12).toBool();
        rows.append(r);
    }
    return rows;
}

bool Storage::applyWindow(const proto::Page &page, qint64 before, qint64 gapLo) {
    if (!begin(Durability::Relaxed))
        return false;
    auto abort = [this]() {
        const QString e = error_;
        rollback();
        return fail(e);
    };
    QSqlDatabase db = QSqlDatabase::database(connection_, false);
    if (before == 0 && !startRebuild(page.conv, page.head))
        return abort();
    for (const proto::Event &e : page.events)
        if (!insertEvent(e, e.epoch > 0 ? e.epoch : page.epoch))
            return abort();
    // What is still missing below the window: [gapLo, oldest - 1], if the
    // server has older readable events (has_older) that we do not hold.
    const qint64 missingHi = page.hasOlder ? page.oldest - 1 : 0;
    {
        QSqlQuery g(db);
        if (before == 0) {
            // The newest window: it covers every readable event in [oldest, head].
            // The cursor moves to its head (C7 holds forward from there).
            g.prepare(QStringLiteral(
                "UPDATE conversations SET after = MAX(after, :head), epoch = :epoch, head = MAX(head, :head),"
                " min_seq = :min_seq, gap_to = CASE WHEN :trimmed THEN MAX(gap_to, :min_seq - 1) ELSE gap_to END"
                " WHERE conv = :conv"));
            g.bindValue(QStringLiteral(":head"), page.head);
            g.bindValue(QStringLiteral(":epoch"), page.epoch);
            g.bindValue(QStringLiteral(":min_seq"), page.minSeq);
            g.bindValue(QStringLiteral(":trimmed"), page.trimmed ? 1 : 0);
            g.bindValue(QStringLiteral(":conv"), page.conv);
        } else {
            g.prepare(QStringLiteral("DELETE FROM gaps WHERE conv = ? AND lo = ?"));
            g.addBindValue(page.conv);
            g.addBindValue(gapLo);
        }
        if (!exec(g)) { g = QSqlQuery(); return abort(); }
    }
    if (missingHi >= gapLo && gapLo > 0) {
        QSqlQuery g(db);
        g.prepare(QStringLiteral("INSERT OR REPLACE INTO gaps(conv, lo, hi) VALUES(?, ?, ?)"));
        g.addBindValue(page.conv);
        g.addBindValue(gapLo);
        g.addBindValue(missingHi);
        if (!exec(g)) { g = QSqlQuery(); return abort(); }
    }
    if (!countArrivals(page.conv, page.events))
        return abort();
    return commit();
}

std::optional<QList<Gap>> Storage::gaps(const QString &conv) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT lo, hi FROM gaps WHERE conv = ? ORDER BY lo"));
    q.addBindValue(conv);
    if (!exec(q))
        return std::nullopt;
    QList<Gap> out;
    while (q.next())
        out.append(Gap{q.value(0).toLongLong(), q.value(1).toLongLong()});
    return out;
}

std::optional<qint64> Storage::floorFor(const QString &conv, qint64 below, int count) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT MIN(seq) FROM (SELECT seq FROM events WHERE conv = ? AND seq < ?"
                             " AND kind <> 'recall' ORDER BY seq DESC LIMIT ?)"));
    q.addBindValue(conv);
    q.addBindValue(below);
    q.addBindValue(count);
    if (!exec(q) || !q.next())
        return std::nullopt;
    return q.value(0).toLongLong();
}

std::optional<bool> Storage::hasEventsBelow(const QString &conv, qint64 seq) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT EXISTS(SELECT 1 FROM events WHERE conv = ? AND seq < ? AND kind <> 'recall')"));
    q.addBindValue(conv);
    q.addBindValue(seq);
    if (!exec(q) || !q.next())
        return std::nullopt;
    return q.value(0).toBool();
}

std::optional<QList<proto::Event>> Storage::events(const QString &conv) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT conv, seq, mid, kind, sender, body, ts, epoch, target, user FROM events"
                             " WHERE conv = ? ORDER BY seq"));
    q.addBindValue(conv);
    if (!exec(q))
        return std::nullopt;
    QList<proto::Event> out;
    while (q.next()) {
        proto::Event e;
        e.conv = q.value(0).toString();
        e.seq = q.value(1).toLongLong();
        e.mid = q.value(2).toString();
        e.kind = q.value(3).toString();
        e.sender = q.value(4).toString();
        e.body = q.value(5).toString();
        e.ts = q.value(6).toLongLong();
        e.epoch = q.value(7).toLongLong();
        e.target = q.value(8).toLongLong();
        e.user = q.value(9).toString();
        out.append(e);
    }
    return out;
}

bool Storage::eventInsertFault() {
    if (eventFaultCountdown_ > 0 && --eventFaultCountdown_ == 0) {
        fail(QStringLiteral("injected storage fault (event insert)"));
        return true;
    }
    return false;
}

QString Storage::pragma(const QString &name) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    if (!q.exec(QStringLiteral("PRAGMA ") + name) || !q.next())
        return {};
    return q.value(0).toString();
}

QString Storage::cmidAt(const QString &conv, qint64 seq) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    // Not ours if the event stored at that seq carries another cmid.
    q.prepare(QStringLiteral("SELECT lm.cmid FROM local_messages lm WHERE lm.conv = :conv AND lm.seq = :seq"
                             " AND lm.kind = 'send' AND NOT EXISTS(SELECT 1 FROM events e WHERE e.conv = :conv"
                             " AND e.seq = :seq AND e.cmid IS NOT NULL AND e.cmid <> lm.cmid)"));
    q.bindValue(QStringLiteral(":conv"), conv);
    q.bindValue(QStringLiteral(":seq"), seq);
    if (!exec(q) || !q.next())
        return {};
    return q.value(0).toString();
}

bool Storage::clearReadPending(const QString &conv) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("UPDATE conversations SET read_pending = 0 WHERE conv = ?"));
    q.addBindValue(conv);
    return execRelaxed(q);
}

} // namespace im::detail
