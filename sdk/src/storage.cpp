// Storage, the core: opening and locking the store, transactions and their
// durability, meta values. The SQL of each table family lives in its own
// file: storage_migrations.cpp (schema), storage_outbox.cpp (outbox and our
// own messages), storage_conversations.cpp (conversations, cursors, markers),
// storage_timeline.cpp (events, pages, windows, gaps, the timeline read).
#include "storage_p.h"
#include "storagesql_p.h"

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
        || !appleFullFsync() || !migrate() || !checkSearchVersion()) {
        const QString e = error_;
        close();
        return fail(e);
    }
    return true;
}

void Storage::close() {
    search_.reset(); // its statements belong to the connection
    page_.reset();
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
    if (recordRelaxed_ && relaxed_)
        relaxedWrites_.append(q.lastQuery());
    if (!q.exec())
        return fail(QStringLiteral("SQLite: %1 (%2)").arg(q.lastError().text(), q.lastQuery()));
    if (!inTransaction_ && !relaxed_ && !q.isSelect()) {
        // A write in autocommit mode under synchronous=FULL: a flush of its own.
        const QString sql = q.lastQuery().trimmed().left(8).toUpper();
        if (!sql.startsWith(u"PRAGMA") && !sql.startsWith(u"BEGIN") && !sql.startsWith(u"COMMIT")
            && !sql.startsWith(u"ROLLBACK"))
            ++flushedCommits_;
    }
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
    if (execSql(QStringLiteral("BEGIN IMMEDIATE"))) {
        inTransaction_ = true;
        return true;
    }
    const QString e = error_;
    restoreDurability();
    return fail(e);
}

bool Storage::commit() {
    if (execSql(QStringLiteral("COMMIT"))) {
        inTransaction_ = false;
        if (!relaxed_)
            ++flushedCommits_;
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
    inTransaction_ = false;
    restoreDurability();
    requeued_.clear(); // what a rolled-back rebuild put back is not there
    knownTerms_.clear(); // nor the search vocabulary it wrote
    endLookAhead();      // nor a page's look
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

} // namespace im::detail
