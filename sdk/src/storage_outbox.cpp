// Storage: the outbox table and local_messages (our own messages and their
// states), written with synchronous=FULL where obligation 1 needs it.
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

qint64 Storage::enqueue(const OutboxRow &row) {
    if (!begin())
        return 0;
    qint64 id = 0;
    {
        QSqlQuery q(QSqlDatabase::database(connection_, false));
        // attempts > 0: the entry goes on the wire in the next turn, and its
        // on-the-wire mark rides this flush (Outbox::enqueue, issue 48).
        q.prepare(QStringLiteral("INSERT INTO outbox(cmid, kind, conv, body, target, created_at, owner, attempts,"
                                 " reply_to, emoji, react_on, target_cmid) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
        q.addBindValue(row.cmid);
        q.addBindValue(row.kind);
        q.addBindValue(row.conv);
        q.addBindValue(nullIfEmpty(row.body));
        q.addBindValue(row.target > 0 ? QVariant(row.target) : QVariant(QMetaType(QMetaType::LongLong)));
        q.addBindValue(row.createdAt);
        q.addBindValue(nullIfEmpty(row.owner));
        q.addBindValue(row.attempts);
        q.addBindValue(row.replyTo > 0 ? QVariant(row.replyTo) : QVariant(QMetaType(QMetaType::LongLong)));
        q.addBindValue(nullIfEmpty(row.emoji));
        q.addBindValue(row.kind == u"react" ? QVariant(row.on ? 1 : 0) : QVariant(QMetaType(QMetaType::Int)));
        q.addBindValue(nullIfEmpty(row.targetCmid));
        if (!exec(q)) { q = QSqlQuery(); rollback(); return 0; }
        id = q.lastInsertId().toLongLong();
        QSqlQuery m(QSqlDatabase::database(connection_, false));
        m.prepare(QStringLiteral("INSERT INTO local_messages(cmid, kind, conv, body, target, created_at, state, reply_to)"
                                 " VALUES(?, ?, ?, ?, ?, ?, ?, ?)"));
        m.addBindValue(row.cmid);
        m.addBindValue(row.kind);
        m.addBindValue(row.conv);
        m.addBindValue(nullIfEmpty(row.body));
        m.addBindValue(row.target > 0 ? QVariant(row.target) : QVariant(QMetaType(QMetaType::LongLong)));
        m.addBindValue(row.createdAt);
        m.addBindValue(int(MessageState::Pending));
        m.addBindValue(row.replyTo > 0 ? QVariant(row.replyTo) : QVariant(QMetaType(QMetaType::LongLong)));
        if (!exec(m)) { q = QSqlQuery(); m = QSqlQuery(); rollback(); return 0; }
        if (row.file) {
            QSqlQuery f(QSqlDatabase::database(connection_, false));
            f.prepare(QStringLiteral("INSERT INTO outbox_files(cmid, name, mime, size, sha256, att_id, complete)"
                                     " VALUES(?, ?, ?, ?, ?, ?, ?)"));
            f.addBindValue(row.cmid);
            f.addBindValue(row.file->name);
            f.addBindValue(row.file->mime);
            f.addBindValue(row.file->size);
            f.addBindValue(row.file->sha256);
            f.addBindValue(nullIfEmpty(row.file->attId));
            f.addBindValue(row.file->complete ? 1 : 0);
            if (!exec(f)) { q = QSqlQuery(); m = QSqlQuery(); f = QSqlQuery(); rollback(); return 0; }
        }
    }
    if (!commit())
        return 0;
    return id;
}

std::optional<QList<OutboxRow>> Storage::loadOutbox() {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT o.id, o.cmid, o.kind, o.conv, o.body, o.target, o.created_at, o.attempts,"
                             " o.last_error, o.next_retry_at, o.owner, o.reply_to, o.emoji, o.react_on, o.target_cmid,"
                             " f.cmid, f.name, f.mime, f.size, f.sha256, f.att_id, f.complete"
                             " FROM outbox o LEFT JOIN outbox_files f ON f.cmid = o.cmid ORDER BY o.id"));
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
        r.replyTo = q.value(11).toLongLong();
        r.emoji = q.value(12).toString();
        r.on = q.value(13).toInt() != 0;
        r.targetCmid = q.value(14).toString();
        if (!q.value(15).isNull()) {
            OutboxFile file;
            file.name = q.value(16).toString();
            file.mime = q.value(17).toString();
            file.size = q.value(18).toLongLong();
            file.sha256 = q.value(19).toString();
            file.attId = q.value(20).toString();
            file.complete = q.value(21).toInt() != 0;
            r.file = file;
        }
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

bool Storage::settleOutbox(const QList<Finish> &finished, const QList<Retry> &retries) {
    if (!begin(Durability::Relaxed))
        return false;
    {
        QSqlDatabase db = QSqlDatabase::database(connection_, false);
        QSqlQuery del(db), delFile(db), upd(db), retry(db);
        del.prepare(QStringLiteral("DELETE FROM outbox WHERE cmid = ?"));
        delFile.prepare(QStringLiteral("DELETE FROM outbox_files WHERE cmid = ?"));
        upd.prepare(QStringLiteral("UPDATE local_messages SET state = ?, error_code = ?, seq = ?, dup = ?, epoch = ?"
                                   " WHERE cmid = ?"));
        // MAX: a retry batched before the next attempt went on the wire
        // (markOnWire) must not take its count back (found by fuzz_sdk_apply).
        retry.prepare(QStringLiteral("UPDATE outbox SET attempts = MAX(attempts, ?), last_error = ?, next_retry_at = ? WHERE cmid = ?"));
        bool ok = true;
        for (const Finish &f : finished) {
            del.addBindValue(f.cmid);
            delFile.bindValue(0, f.cmid);
            upd.addBindValue(f.state);
            upd.addBindValue(nullIfEmpty(f.errorCode));
            upd.addBindValue(f.seq > 0 ? QVariant(f.seq) : QVariant(QMetaType(QMetaType::LongLong)));
            upd.addBindValue(f.dup ? 1 : 0);
            upd.addBindValue(f.epoch > 0 ? QVariant(f.epoch) : QVariant(QMetaType(QMetaType::LongLong)));
            upd.addBindValue(f.cmid);
            // A sent file's row stays until its event is stored
            // (insertEvent): until then the timeline shows the file from
            // it, so a message never loses its attachment between the ack
            // and the page that brings the event.
            const bool keepFile = f.state == int(MessageState::Sent) && f.seq > 0;
            if (!exec(del) || (!keepFile && !exec(delFile)) || !exec(upd)) {
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
            delFile = QSqlQuery();
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
    // FULL: after a power cut, an entry that may be on the server must not
    // look unsent (cancel() would then drop a message the others can read).
    bool ok = begin(Durability::Full);
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

bool Storage::rewriteOutboxBody(const QString &cmid, const QString &body) {
    if (!begin())
        return false;
    {
        QSqlDatabase db = QSqlDatabase::database(connection_, false);
        QSqlQuery q(db), m(db);
        q.prepare(QStringLiteral("UPDATE outbox SET body = ? WHERE cmid = ?"));
        q.addBindValue(body);
        q.addBindValue(cmid);
        m.prepare(QStringLiteral("UPDATE local_messages SET body = ? WHERE cmid = ?"));
        m.addBindValue(body);
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

bool Storage::resolveOutboxTarget(const QString &cmid, qint64 target) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("UPDATE outbox SET target = ? WHERE cmid = ?"));
    q.addBindValue(target);
    q.addBindValue(cmid);
    if (!execRelaxed(q)) // can be had again: from the target's local_messages row
        return false;
    QSqlQuery m(QSqlDatabase::database(connection_, false));
    m.prepare(QStringLiteral("UPDATE local_messages SET target = ? WHERE cmid = ?"));
    m.addBindValue(target);
    m.addBindValue(cmid);
    return execRelaxed(m);
}

qint64 Storage::ownSeq(const QString &conv, const QString &cmid, bool *final) {
    *final = false;
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT state, seq FROM local_messages WHERE cmid = ? AND conv = ? AND kind = 'send'"));
    q.addBindValue(cmid);
    q.addBindValue(conv);
    if (!exec(q))
        return 0;
    if (q.next()) {
        if (q.value(1).toLongLong() > 0)
            return q.value(1).toLongLong();
        *final = q.value(0).toInt() != int(MessageState::Pending);
        return 0;
    }
    q.finish();
    // Sent from another device of ours: its event carries the cmid.
    QSqlQuery e(QSqlDatabase::database(connection_, false));
    e.prepare(QStringLiteral("SELECT seq FROM events WHERE conv = ? AND cmid = ? AND kind = 'msg'"));
    e.addBindValue(conv);
    e.addBindValue(cmid);
    if (exec(e) && e.next())
        return e.value(0).toLongLong();
    *final = true;
    return 0;
}

Storage::Quoted Storage::quoted(const QString &conv, qint64 seq) {
    Quoted out;
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT sender, COALESCE(edit_body, body) FROM events WHERE conv = ? AND seq = ? AND kind = 'msg'"));
    q.addBindValue(conv);
    q.addBindValue(seq);
    if (exec(q) && q.next()) {
        out.sender = q.value(0).toString();
        out.body = q.value(1).toString();
        out.found = true;
    }
    return out;
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
        QSqlQuery f(QSqlDatabase::database(connection_, false));
        f.prepare(QStringLiteral("DELETE FROM outbox_files WHERE cmid = ?"));
        f.addBindValue(cmid);
        if (!exec(q) || !exec(m) || !exec(f)) {
            const QString e = error_;
            q = QSqlQuery();
            m = QSqlQuery();
            f = QSqlQuery();
            rollback();
            return fail(e);
        }
    }
    return commit();
}

bool Storage::setOutboxUpload(const QString &cmid, const QString &attId, bool complete) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("UPDATE outbox_files SET att_id = ?, complete = ? WHERE cmid = ?"));
    q.addBindValue(nullIfEmpty(attId));
    q.addBindValue(complete ? 1 : 0);
    q.addBindValue(cmid);
    return exec(q); // autocommit under synchronous=FULL: durable before the first PUT
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

std::optional<LocalMessage> Storage::localMessage(const QString &cmid) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT cmid, kind, conv, body, target, state, error_code, seq, dup, reply_to"
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
    m.replyTo = q.value(9).toLongLong();
    return m;
}

} // namespace im::detail
