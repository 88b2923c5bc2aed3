// Storage: conversations, their cursors and markers, and the install reset.
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
            "  AND e.sender IS NOT :self AND e.recalled = 0"
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

bool Storage::resetConversation(const QString &conv, bool dropEvents) {
    if (!begin(Durability::Relaxed))
        return false;
    {
        if (dropEvents) {
            if (!unindexRange(conv, -1)) { rollback(); return false; }
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

bool Storage::setRead(const QString &conv, qint64 read, bool *serverCountNeeded) {
    if (serverCountNeeded)
        *serverCountNeeded = false;
    if (!begin(Durability::Relaxed))
        return false;
    QSqlDatabase db = QSqlDatabase::database(connection_, false);
    {
        QSqlQuery q(db);
        q.prepare(QStringLiteral("SELECT read, unread, unread_head, after, gap_to FROM conversations WHERE conv = ?"));
        q.addBindValue(conv);
        if (!exec(q)) { q = QSqlQuery(); rollback(); return false; }
        if (!q.next()) { q = QSqlQuery(); rollback(); return true; }
        const qint64 was = q.value(0).toLongLong(), unread = q.value(1).toLongLong();
        const qint64 counted = q.value(2).toLongLong(), after = q.value(3).toLongLong();
        const qint64 gapTo = q.value(4).toLongLong();
        q = QSqlQuery();
        const qint64 now = std::max(was, read);
        // Read up to what the badge accounts for: nothing is unread. A
        // badge at 0 stays 0 (a read only moves forward). Read part of the
        // way: recount (now, unread_head] from the stored rows if they are
        // all here and few; the server's own count needs a walk otherwise.
        std::optional<qint64> recount;
        if (now >= counted)
            recount = 0;
        else if (now > was && unread > 0) {
            bool whole = after >= counted && gapTo <= now && counted - now <= kMaxLocalUnreadRange;
            if (whole) {
                QSqlQuery g(db);
                g.prepare(QStringLiteral("SELECT EXISTS(SELECT 1 FROM gaps WHERE conv = ? AND hi > ? AND lo <= ?)"));
                g.addBindValue(conv);
                g.addBindValue(now);
                g.addBindValue(counted);
                if (!exec(g) || !g.next()) { g = QSqlQuery(); rollback(); return false; }
                whole = !g.value(0).toBool();
            }
            if (whole) {
                const std::optional<QString> self = meta(QStringLiteral("user"));
                if (!self) { rollback(); return false; }
                // The same rule as countArrivals(): another user's msg,
                // not recalled (an index range of at most the limit above).
                QSqlQuery c(db);
                c.prepare(QStringLiteral(
                    "SELECT COUNT(*) FROM events e WHERE e.conv = :conv AND e.seq > :read AND e.seq <= :counted"
                    " AND e.kind = 'msg' AND e.sender IS NOT :self AND e.recalled = 0"
                    " AND NOT EXISTS(SELECT 1 FROM events r WHERE r.conv = e.conv AND r.kind = 'recall' AND r.target = e.seq)"));
                c.bindValue(QStringLiteral(":conv"), conv);
                c.bindValue(QStringLiteral(":read"), now);
                c.bindValue(QStringLiteral(":counted"), counted);
                c.bindValue(QStringLiteral(":self"), *self);
                if (!exec(c) || !c.next()) { c = QSqlQuery(); rollback(); return false; }
                recount = c.value(0).toLongLong();
            } else if (serverCountNeeded) {
                *serverCountNeeded = true;
            }
        }
        QSqlQuery u(db);
        u.prepare(QStringLiteral("UPDATE conversations SET read = :read,"
                                 " read_pending = CASE WHEN read_pending <= :read THEN 0 ELSE read_pending END,"
                                 " unread = COALESCE(:unread, unread) WHERE conv = :conv"));
        u.bindValue(QStringLiteral(":read"), now);
        u.bindValue(QStringLiteral(":unread"), recount ? QVariant(*recount) : QVariant(QMetaType(QMetaType::LongLong)));
        u.bindValue(QStringLiteral(":conv"), conv);
        if (!exec(u)) { u = QSqlQuery(); rollback(); return false; }
    }
    return commit();
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
    for (const QString &sql : {QStringLiteral("INSERT INTO search(search) VALUES('delete-all')"),
                               QStringLiteral("DELETE FROM events"), QStringLiteral("DELETE FROM conversations"),
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

bool Storage::clearReadPending(const QString &conv) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("UPDATE conversations SET read_pending = 0 WHERE conv = ?"));
    q.addBindValue(conv);
    return execRelaxed(q);
}

} // namespace im::detail
