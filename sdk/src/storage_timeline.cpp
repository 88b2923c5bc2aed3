// Storage: events (pages, pushes, history windows), gaps, and the timeline
// read by the models.
#include "storage_p.h"
#include "storagesql_p.h"

#include "logging_p.h"

#include <im/types.h>

#include <QtCore/QDateTime>
#include <QtCore/QHash>
#include <QtCore/QJsonArray>
#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>
#include <QtCore/QSet>
#include <QtCore/QVariant>
#include <QtSql/QSqlError>
#include <QtSql/QSqlQuery>

#include <algorithm>

namespace im::detail {

namespace {

QString reactionsJson(const QList<proto::Reaction> &list) {
    if (list.isEmpty())
        return {};
    QJsonArray a;
    for (const proto::Reaction &r : list)
        a.append(QJsonObject{{QStringLiteral("emoji"), r.emoji}, {QStringLiteral("count"), r.count},
                             {QStringLiteral("me"), r.me}});
    return QString::fromUtf8(QJsonDocument(a).toJson(QJsonDocument::Compact));
}

QList<proto::Reaction> reactionsFrom(const QString &json) {
    QList<proto::Reaction> out;
    if (json.isEmpty())
        return out;
    for (const QJsonValue &v : QJsonDocument::fromJson(json.toUtf8()).array()) {
        const QJsonObject o = v.toObject();
        out.append({o.value(QLatin1String("emoji")).toString(), qint64(o.value(QLatin1String("count")).toDouble()),
                    o.value(QLatin1String("me")).toBool()});
    }
    return out;
}

// Contract section 12's order: most counted first, ties in the emoji's byte order.
void sortReactions(QList<proto::Reaction> &list) {
    std::stable_sort(list.begin(), list.end(), [](const proto::Reaction &a, const proto::Reaction &b) {
        return a.count != b.count ? a.count > b.count : a.emoji.toUtf8() < b.emoji.toUtf8();
    });
}

QVariant nullIfZero(qint64 v) { return v > 0 ? QVariant(v) : QVariant(QMetaType(QMetaType::LongLong)); }

// A msg's attachments as stored (events.attachments): the wire's shape.
QString attachmentsJson(const QList<proto::Attachment> &list) {
    if (list.isEmpty())
        return {};
    QJsonArray a;
    for (const proto::Attachment &x : list)
        a.append(QJsonObject{{QStringLiteral("att_id"), x.id}, {QStringLiteral("name"), x.name},
                             {QStringLiteral("mime"), x.mime}, {QStringLiteral("size"), x.size},
                             {QStringLiteral("sha256"), x.sha256}});
    return QString::fromUtf8(QJsonDocument(a).toJson(QJsonDocument::Compact));
}

QList<proto::Attachment> attachmentsFrom(const QString &json) {
    QList<proto::Attachment> out;
    if (json.isEmpty())
        return out;
    for (const QJsonValue &v : QJsonDocument::fromJson(json.toUtf8()).array()) {
        const QJsonObject o = v.toObject();
        out.append({o.value(QStringLiteral("att_id")).toString(), o.value(QStringLiteral("name")).toString(),
                    o.value(QStringLiteral("mime")).toString(), o.value(QStringLiteral("size")).toInteger(),
                    o.value(QStringLiteral("sha256")).toString()});
    }
    return out;
}

// The names the search index covers (storage_search.cpp), one a line.
QString attachmentNames(const QList<proto::Attachment> &list) {
    QStringList names;
    for (const proto::Attachment &x : list)
        names << x.name;
    return names.join(u'\n');
}

} // namespace

PageStatements::PageStatements(const QSqlDatabase &db)
    : upsert(db), attachment(db), erase(db), edit(db), recall(db), reactionRead(db), reactionWrite(db),
      ensureConv(db), convEpoch(db), pageCursor(db), unreadRead(db), unreadRecalled(db), unreadWrite(db), sentFile(db) {
    // Keyed by (conv, seq): re-applying is harmless (events are immutable on
    // the server; replacing also heals a rebuild after CURSOR_AHEAD). A msg's
    // later changes (contract section 12) are the newer of what is stored
    // and what this copy carries: by edit_seq, by reactions_seq (a tie keeps
    // the stored one: a push's `me` is always false), and only for the same
    // event (mid) -- another mid at this seq is another history's.
    upsert.prepare(QStringLiteral(
        "INSERT INTO events(conv, seq, mid, kind, sender, body, ts, epoch, target, user, cmid, reply_to, edit_seq,"
        " edit_body, edit_ts, reactions, reactions_seq, recalled, emoji, react_on, search_id, attachments, att_names)"
        " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(conv, seq) DO UPDATE SET mid = excluded.mid, kind = excluded.kind, sender = excluded.sender,"
        " body = excluded.body, ts = excluded.ts, epoch = excluded.epoch, target = excluded.target,"
        " user = excluded.user, cmid = excluded.cmid, reply_to = excluded.reply_to,"
        " attachments = excluded.attachments, att_names = excluded.att_names,"
        " emoji = excluded.emoji, react_on = excluded.react_on,"
        " edit_seq = CASE WHEN events.mid IS excluded.mid AND COALESCE(events.edit_seq, 0) > COALESCE(excluded.edit_seq, 0)"
        "  THEN events.edit_seq ELSE excluded.edit_seq END,"
        " edit_body = CASE WHEN events.mid IS excluded.mid AND COALESCE(events.edit_seq, 0) > COALESCE(excluded.edit_seq, 0)"
        "  THEN events.edit_body ELSE excluded.edit_body END,"
        " edit_ts = CASE WHEN events.mid IS excluded.mid AND COALESCE(events.edit_seq, 0) > COALESCE(excluded.edit_seq, 0)"
        "  THEN events.edit_ts ELSE excluded.edit_ts END,"
        " reactions = CASE WHEN events.mid IS excluded.mid AND events.reactions_seq IS NOT NULL"
        "  AND events.reactions_seq >= COALESCE(excluded.reactions_seq, 0) THEN events.reactions ELSE excluded.reactions END,"
        " reactions_seq = CASE WHEN events.mid IS excluded.mid AND events.reactions_seq IS NOT NULL"
        "  AND events.reactions_seq >= COALESCE(excluded.reactions_seq, 0) THEN events.reactions_seq ELSE excluded.reactions_seq END,"
        " recalled = CASE WHEN events.mid IS excluded.mid THEN MAX(events.recalled, excluded.recalled) ELSE excluded.recalled END"));
    sentFile.prepare(QStringLiteral("DELETE FROM outbox_files WHERE cmid = ?"));
    // Immutable on the server (the id names one upload's bytes).
    attachment.prepare(QStringLiteral("INSERT OR IGNORE INTO attachments(att_id, name, mime, size, sha256)"
                                      " VALUES(?, ?, ?, ?, ?)"));
    erase.prepare(QStringLiteral("UPDATE events SET body = NULL, edit_seq = NULL, edit_body = NULL, edit_ts = NULL,"
                                 " attachments = NULL, att_names = NULL, recalled = 1"
                                 " WHERE conv = ? AND seq = ? AND kind = 'msg'"));
    edit.prepare(QStringLiteral("UPDATE events SET edit_seq = ?, edit_body = ?, edit_ts = ?"
                                " WHERE conv = ? AND seq = ? AND kind = 'msg' AND COALESCE(edit_seq, 0) < ?"));
    recall.prepare(QStringLiteral("UPDATE events SET recalled = 1 WHERE conv = ? AND seq = ? AND kind = 'msg'"));
    reactionRead.prepare(QStringLiteral("SELECT reactions FROM events WHERE conv = ? AND seq = ? AND kind = 'msg'"
                                        " AND COALESCE(reactions_seq, 0) < ?"));
    reactionWrite.prepare(
        QStringLiteral("UPDATE events SET reactions = ?, reactions_seq = ? WHERE conv = ? AND seq = ?"));
    ensureConv.prepare(QStringLiteral("INSERT OR IGNORE INTO conversations(conv) VALUES(?)"));
    convEpoch.prepare(QStringLiteral("SELECT epoch FROM conversations WHERE conv = ?"));
    pageCursor.prepare(QStringLiteral(
        "UPDATE conversations SET after = MAX(after, :after), epoch = :epoch, head = MAX(head, :head),"
        " min_seq = :min_seq, gap_to = CASE WHEN :trimmed THEN MAX(gap_to, :min_seq - 1) ELSE gap_to END"
        " WHERE conv = :conv"));
    unreadRead.prepare(QStringLiteral("SELECT read, unread_head FROM conversations WHERE conv = ?"));
    unreadRecalled.prepare(
        QStringLiteral("SELECT 1 FROM events WHERE conv = ? AND seq = ? AND kind = 'msg' AND sender IS NOT ?"));
    unreadWrite.prepare(
        QStringLiteral("UPDATE conversations SET unread = MAX(0, unread + ?), unread_head = ? WHERE conv = ?"));
}

PageStatements &Storage::pageStatements() {
    if (!page_)
        page_ = std::make_unique<PageStatements>(QSqlDatabase::database(connection_, false));
    return *page_;
}

bool Storage::insertEvent(const proto::Event &e, qint64 epoch) {
    // The search index forgets what this row showed before (a re-applied
    // copy may carry a newer edit, another history's event may replace it);
    // a new message is indexed at once, its search_id stored with it.
    bool isNew = false;
    qint64 searchId = 0;
    if (!indexBeforeInsert(e, &isNew, &searchId))
        return false;
    PageStatements &st = pageStatements();
    QSqlQuery &q = st.upsert; // prepared once (PageStatements)
    q.bindValue(0, e.conv);
    q.bindValue(1, e.seq);
    q.bindValue(2, e.mid);
    q.bindValue(3, e.kind);
    q.bindValue(4, nullIfEmpty(e.sender));
    q.bindValue(5, nullIfEmpty(e.body));
    q.bindValue(6, e.ts);
    q.bindValue(7, epoch);
    q.bindValue(8, nullIfZero(e.target));
    q.bindValue(9, nullIfEmpty(e.user));
    q.bindValue(10, e.cmid.isEmpty() ? QVariant(QMetaType(QMetaType::QString)) : QVariant(e.cmid));
    q.bindValue(11, nullIfZero(e.replyTo));
    q.bindValue(12, nullIfZero(e.editSeq));
    q.bindValue(13, e.editSeq > 0 ? QVariant(e.editBody) : QVariant(QMetaType(QMetaType::QString)));
    q.bindValue(14, nullIfZero(e.editTs));
    q.bindValue(15, nullIfEmpty(reactionsJson(e.reactions)));
    q.bindValue(16, nullIfZero(e.reactionsSeq));
    q.bindValue(17, e.recalled ? 1 : 0);
    q.bindValue(18, nullIfEmpty(e.emoji));
    q.bindValue(19, e.kind == u"reaction" ? QVariant(e.on ? 1 : 0) : QVariant(QMetaType(QMetaType::Int)));
    q.bindValue(20, nullIfZero(searchId)); // the conflict path keeps the row's own (NULL: unindexed above)
    q.bindValue(21, nullIfEmpty(attachmentsJson(e.attachments)));
    q.bindValue(22, e.attachments.isEmpty() ? QVariant(QMetaType(QMetaType::QString))
                                            : QVariant(attachmentNames(e.attachments)));
    if (eventInsertFault() || !exec(q))
        return false;
    for (const proto::Attachment &a : e.attachments) {
        st.attachment.bindValue(0, a.id);
        st.attachment.bindValue(1, a.name);
        st.attachment.bindValue(2, a.mime);
        st.attachment.bindValue(3, a.size);
        st.attachment.bindValue(4, a.sha256);
        if (!exec(st.attachment))
            return false;
    }
    // Our own file's message is stored: the outbox's row that showed its
    // file between the ack and this page goes (settleOutbox keeps it).
    if (!e.attachments.isEmpty() && !e.cmid.isEmpty()) {
        st.sentFile.bindValue(0, e.cmid);
        if (!exec(st.sentFile))
            return false;
    }
    // An erased msg (a user's erase, docs/protocol.md "Erased events"): no
    // text of it stays here, not even an edit this store showed before.
    if (e.kind == u"msg" && e.erased && !eraseText(e.conv, e.seq))
        return false;
    if (e.kind == u"msg" && !isNew && !indexEvent(e.conv, e.seq))
        return false;
    if (e.kind != u"edit" && e.kind != u"recall")
        return applyChange(e);
    // An edit or a recall changes its target's text: out of the index
    // before, back in (or not, recalled) after, in this transaction.
    return unindexEvent(e.conv, e.target) && applyChange(e) && indexEvent(e.conv, e.target);
}

bool Storage::eraseText(const QString &conv, qint64 seq) {
    QSqlQuery &u = pageStatements().erase;
    u.bindValue(0, conv);
    u.bindValue(1, seq);
    return exec(u);
}

bool Storage::applyChange(const proto::Event &e) {
    // Contract section 12: a later edit or reaction event changes its stored
    // target only when its seq is above what the target already shows
    // (edit_seq / reactions_seq), so re-applying a page or a push is
    // harmless. A target not stored here needs nothing: when it comes, its
    // copy carries its changes as of then.
    if (e.kind == u"edit" && e.erased)
        return true; // an erased edit has no text to show
    if (e.kind == u"recall" && e.erased)
        return eraseText(e.conv, e.target); // an erase's recall: the target's text goes too
    PageStatements &st = pageStatements();
    if (e.kind == u"edit") {
        QSqlQuery &u = st.edit;
        u.bindValue(0, e.seq);
        u.bindValue(1, e.body);
        u.bindValue(2, e.ts);
        u.bindValue(3, e.conv);
        u.bindValue(4, e.target);
        u.bindValue(5, e.seq);
        return exec(u);
    }
    if (e.kind == u"recall") {
        QSqlQuery &u = st.recall;
        u.bindValue(0, e.conv);
        u.bindValue(1, e.target);
        return exec(u);
    }
    if (e.kind != u"reaction")
        return true;
    QSqlQuery &s = st.reactionRead;
    s.bindValue(0, e.conv);
    s.bindValue(1, e.target);
    s.bindValue(2, e.seq);
    if (!exec(s))
        return false;
    if (!s.next()) {
        s.finish();
        return true; // not stored here, or already counted
    }
    QList<proto::Reaction> list = reactionsFrom(s.value(0).toString());
    s.finish();
    const std::optional<QString> self = meta(QStringLiteral("user"));
    const bool mine = self && e.sender == *self;
    auto it = std::find_if(list.begin(), list.end(), [&](const proto::Reaction &r) { return r.emoji == e.emoji; });
    if (it == list.end() && e.on)
        it = list.insert(list.end(), proto::Reaction{e.emoji, 0, false});
    if (it != list.end()) {
        it->count += e.on ? 1 : -1;
        if (mine)
            it->me = e.on;
        if (it->count <= 0)
            list.erase(it);
    }
    sortReactions(list);
    QSqlQuery &u = st.reactionWrite;
    u.bindValue(0, nullIfEmpty(reactionsJson(list)));
    u.bindValue(1, e.seq);
    u.bindValue(2, e.conv);
    u.bindValue(3, e.target);
    return exec(u);
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
    PageStatements &st = pageStatements();
    QSqlQuery &c = st.unreadRead;
    c.bindValue(0, conv);
    if (!exec(c))
        return false;
    if (!c.next())
        return true;
    const qint64 read = c.value(0).toLongLong();
    const qint64 counted = c.value(1).toLongLong();
    c.finish();
    qint64 delta = 0, top = counted;
    QSqlQuery &t = st.unreadRecalled;
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
            t.bindValue(0, conv);
            t.bindValue(1, e.target);
            t.bindValue(2, *self);
            if (!exec(t))
                return false;
            if (t.next())
                --delta;
            t.finish();
        }
    }
    QSqlQuery &u = st.unreadWrite;
    u.bindValue(0, delta);
    u.bindValue(1, top);
    u.bindValue(2, conv);
    return exec(u);
}

bool Storage::startRebuild(const QString &conv, qint64 head) {
    {
        PageStatements &st = pageStatements();
        st.ensureConv.bindValue(0, conv);
        if (!exec(st.ensureConv))
            return false;
        QSqlQuery &e = st.convEpoch;
        e.bindValue(0, conv);
        if (!exec(e) || !e.next())
            return false;
        const bool rebuilding = e.value(0).toLongLong() == 0;
        e.finish();
        if (!rebuilding)
            return true;
    }
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    // No cursor (new here, or dropped after CURSOR_AHEAD): the server's head
    // is the truth. What we hold above it the server no longer has (restored
    // from a backup); our old head must not keep asking for it. Our own
    // messages among it go back to the outbox first.
    if (!requeueLostOwn(conv, head) || !unindexRange(conv, head))
        return false;
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

bool Storage::requeueLostOwn(const QString &conv, qint64 head) {
    // Our messages the server confirmed at a seq above its head now: it lost
    // them, and their request keys with them, so the same cmid creates each
    // once more. Only what was Sent (a Failed or Expired one was never
    // stored; one still in the outbox goes out anyway) and never recalled
    // by us (a recall of it is lost too; resending would bring it back).
    // The epoch is not compared: an epoch bump keeps the seqs, so after a
    // restore and `epoch bump` the rule is the same.
    const std::optional<QString> self = meta(QStringLiteral("user"));
    if (!self)
        return false;
    QSqlDatabase db = QSqlDatabase::database(connection_, false);
    QSqlQuery q(db);
    q.prepare(QStringLiteral(
        "SELECT lm.cmid, lm.body, lm.created_at, lm.reply_to FROM local_messages lm"
        " WHERE lm.conv = :conv AND lm.kind = 'send' AND lm.state = :sent AND lm.seq > :head"
        " AND NOT EXISTS(SELECT 1 FROM local_messages r WHERE r.conv = lm.conv AND r.kind = 'recall'"
        "  AND r.target = lm.seq AND r.state <> :failed)"
        " AND NOT EXISTS(SELECT 1 FROM outbox o WHERE o.cmid = lm.cmid)"
        " ORDER BY lm.created_at, lm.seq"));
    q.bindValue(QStringLiteral(":conv"), conv);
    q.bindValue(QStringLiteral(":sent"), int(MessageState::Sent));
    q.bindValue(QStringLiteral(":failed"), int(MessageState::Failed));
    q.bindValue(QStringLiteral(":head"), head);
    if (!exec(q))
        return false;
    QList<OutboxRow> lost;
    while (q.next()) {
        OutboxRow r;
        r.cmid = q.value(0).toString();
        r.kind = QStringLiteral("send");
        r.conv = conv;
        r.body = q.value(1).toString();
        r.createdAt = q.value(2).toLongLong();
        r.replyTo = q.value(3).toLongLong(); // a reply stays a reply (its fingerprint covers it)
        r.owner = QStringLiteral("user:") + *self; // it went out as this store's user once
        r.attempts = 1; // it was on the wire: cancel() must not drop what others may have read
        lost.append(r);
    }
    q.finish();
    QSqlQuery ins(db), upd(db);
    ins.prepare(QStringLiteral("INSERT INTO outbox(cmid, kind, conv, body, created_at, owner, attempts, reply_to)"
                               " VALUES(?, ?, ?, ?, ?, ?, ?, ?)"));
    upd.prepare(QStringLiteral("UPDATE local_messages SET state = ?, seq = NULL, epoch = NULL, dup = 0, error_code = NULL"
                               " WHERE cmid = ?"));
    for (OutboxRow &r : lost) {
        ins.addBindValue(r.cmid);
        ins.addBindValue(r.kind);
        ins.addBindValue(r.conv);
        ins.addBindValue(r.body);
        ins.addBindValue(r.createdAt);
        ins.addBindValue(r.owner);
        ins.addBindValue(r.attempts);
        ins.addBindValue(r.replyTo > 0 ? QVariant(r.replyTo) : QVariant(QMetaType(QMetaType::LongLong)));
        if (!exec(ins))
            return false;
        r.id = ins.lastInsertId().toLongLong();
        upd.addBindValue(int(MessageState::Pending));
        upd.addBindValue(r.cmid);
        if (!exec(upd))
            return false;
    }
    requeued_.append(lost);
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
    if (!startRebuild(page.conv, page.head) || !lookAhead(page.conv, page.events))
        return abort();
    for (const proto::Event &e : page.events)
        if (!insertEvent(e, e.epoch > 0 ? e.epoch : page.epoch))
            return abort();
    endLookAhead();
    {
        QSqlQuery &q = pageStatements().pageCursor;
        q.bindValue(QStringLiteral(":after"), page.nextAfter);
        q.bindValue(QStringLiteral(":epoch"), page.epoch);
        q.bindValue(QStringLiteral(":head"), page.head);
        q.bindValue(QStringLiteral(":min_seq"), page.minSeq);
        q.bindValue(QStringLiteral(":trimmed"), page.trimmed ? 1 : 0);
        q.bindValue(QStringLiteral(":conv"), page.conv);
        if (!exec(q))
            return abort();
    }
    if (!countArrivals(page.conv, page.events))
        return abort();
    return commit();
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

// Shared by messages() and ownEventRecalled(), for an event `e`:
// the cmid of our message it is, by the cmid it carries (a seq can name
// another's message after an epoch change or a restore); an event stored
// before schema 4 has none and falls back to our message at its (seq,
// epoch).
#define IM_SQL_OWN_CMID_OF_E \
    "COALESCE(e.cmid, (SELECT l2.cmid FROM local_messages l2 WHERE l2.conv = e.conv" \
    " AND l2.seq = e.seq AND l2.epoch = e.epoch AND l2.kind = 'send'))"
// ... and whether a recall event names it.
#define IM_SQL_E_RECALLED "(e.recalled = 1 OR EXISTS(SELECT 1 FROM events r WHERE r.conv = e.conv AND r.kind = 'recall' AND r.target = e.seq))"
// The kinds that are changes of another event, not rows of a timeline.
#define IM_SQL_NOT_A_ROW "('recall', 'edit', 'reaction')"

// The columns of a draft's row after its position (messages()).
#define IM_SQL_DRAFT_COLUMNS \
    " lm.seq, 'msg', :self, lm.body, lm.created_at, lm.cmid, lm.state, lm.error_code, lm.dup, 0, NULL, 1"
// A draft whose own event is stored is that event's row, whatever its
// state: the event may come (by sync or push) before the draft is settled,
// and a crash can leave it Pending until the resend.
#define IM_SQL_DRAFT_NOT_EVENT \
    " AND NOT EXISTS(SELECT 1 FROM events e2 WHERE e2.conv = lm.conv AND e2.cmid = lm.cmid AND e2.sender = :self)"

std::optional<QList<MessageRow>> Storage::messages(const QString &conv, const QString &self, qint64 from) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral(
        "SELECT * FROM ("
        " SELECT e.seq AS pos, e.seq AS seq, e.kind AS kind, e.sender AS sender, e.body AS body, e.ts AS ts, lm.cmid AS cmid,"
        "  lm.state AS state, lm.error_code AS error_code, COALESCE(lm.dup, 0) AS dup,"
        "  " IM_SQL_E_RECALLED " AS recalled,"
        "  e.user AS user, (lm.cmid IS NOT NULL OR e.sender = :self) AS own"
        // Our message, by IM_SQL_OWN_CMID_OF_E.
        " FROM events e LEFT JOIN local_messages lm"
        "  ON lm.cmid = " IM_SQL_OWN_CMID_OF_E
        "  AND lm.conv = e.conv AND lm.kind = 'send' AND e.sender = :self"
        " WHERE e.conv = :conv AND e.seq >= :from AND e.kind NOT IN " IM_SQL_NOT_A_ROW
        // Our drafts, in two halves that each read only what can be shown
        // (local_messages_conv is (conv, seq)): those with a seq read from
        // the window's floor up, never every draft the conversation ever
        // had; those without one (Pending, Failed, Expired before a seq)
        // are few and placed by time.
        " UNION ALL"
        " SELECT lm.seq," IM_SQL_DRAFT_COLUMNS
        " FROM local_messages lm LEFT JOIN conversations c ON c.conv = lm.conv"
        " WHERE lm.conv = :conv AND lm.seq >= :from AND lm.kind = 'send'" IM_SQL_DRAFT_NOT_EVENT
        " AND (c.epoch IS NULL OR c.epoch = 0 OR lm.epoch = c.epoch)"
        " AND NOT EXISTS(SELECT 1 FROM events e2 WHERE e2.conv = lm.conv AND e2.sender = :self"
        "  AND e2.cmid IS NULL AND e2.seq = lm.seq)"
        " UNION ALL"
        " SELECT CASE WHEN lm.state = :pending THEN 9.0e18"
        "  ELSE COALESCE((SELECT MAX(e3.seq) FROM events e3 WHERE e3.conv = lm.conv AND e3.ts <= lm.created_at), 0)"
        "   + 0.5 END," IM_SQL_DRAFT_COLUMNS
        " FROM local_messages lm"
        " WHERE lm.conv = :conv AND lm.seq IS NULL AND lm.kind = 'send'" IM_SQL_DRAFT_NOT_EVENT
        // Placed at (the newest event committed before it) + 0.5: at or
        // above the floor exactly when it was created at or after the
        // oldest commit time among the shown events.
        " AND (lm.state = :pending OR :from <= 0"
        "  OR lm.created_at >= (SELECT MIN(e4.ts) FROM events e4 WHERE e4.conv = :conv AND e4.seq >= :from))"
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
    q.finish();
    if (!addChanges(conv, from, rows))
        return std::nullopt;
    return rows;
}

bool Storage::addChanges(const QString &conv, qint64 from, QList<MessageRow> &rows) {
    // Contract section 12 on the rows messages() read: the current body, a
    // reply's quote, reactions. One range read of the window's changed
    // messages, one of our unconfirmed replies, one of the quoted messages:
    // no query per row.
    QHash<qint64, qsizetype> bySeq;
    QHash<QString, qsizetype> byCmid;
    for (qsizetype i = 0; i < rows.size(); ++i) {
        if (rows.at(i).kind != u"msg")
            continue;
        if (rows.at(i).seq > 0)
            bySeq.insert(rows.at(i).seq, i);
        else if (!rows.at(i).cmid.isEmpty())
            byCmid.insert(rows.at(i).cmid, i);
    }
    QSqlDatabase db = QSqlDatabase::database(connection_, false);
    QSqlQuery q(db);
    q.prepare(QStringLiteral("SELECT seq, reply_to, edit_seq IS NOT NULL, edit_body, reactions, attachments FROM events"
                             " WHERE conv = ? AND seq >= ? AND kind = 'msg'"
                             " AND (reply_to IS NOT NULL OR edit_seq IS NOT NULL OR reactions IS NOT NULL"
                             " OR attachments IS NOT NULL)"));
    q.addBindValue(conv);
    q.addBindValue(from);
    if (!exec(q))
        return false;
    QSet<qint64> quoted;
    while (q.next()) {
        const auto it = bySeq.constFind(q.value(0).toLongLong());
        if (it == bySeq.cend())
            continue;
        MessageRow &r = rows[*it];
        r.replyTo = q.value(1).toLongLong();
        r.edited = q.value(2).toBool();
        if (r.edited)
            r.body = q.value(3).toString();
        r.reactions = reactionsFrom(q.value(4).toString());
        r.attachments = attachmentsFrom(q.value(5).toString());
        if (r.replyTo > 0)
            quoted.insert(r.replyTo);
    }
    q.finish();
    // Our files (sendFile, outbox_files): shown with the message while it
    // is Pending (no att_id until the upload started), and once Sent until
    // the page that brings its event stores the event's own list.
    QHash<QString, qsizetype> filesByCmid = byCmid;
    for (qsizetype i = 0; i < rows.size(); ++i)
        if (rows.at(i).kind == u"msg" && rows.at(i).seq > 0 && !rows.at(i).cmid.isEmpty() &&
            rows.at(i).attachments.isEmpty())
            filesByCmid.insert(rows.at(i).cmid, i);
    if (!filesByCmid.isEmpty()) {
        QSqlQuery f(db);
        f.prepare(QStringLiteral("SELECT cmid, name, mime, size, sha256, COALESCE(att_id, '') FROM outbox_files"));
        if (!exec(f))
            return false;
        while (f.next()) {
            const auto it = filesByCmid.constFind(f.value(0).toString());
            if (it != filesByCmid.cend())
                rows[*it].attachments = {proto::Attachment{f.value(5).toString(), f.value(1).toString(),
                                                           f.value(2).toString(), f.value(3).toLongLong(),
                                                           f.value(4).toString()}};
        }
    }
    if (!byCmid.isEmpty()) {
        // Our replies without a seq yet (Pending, Failed): their reply_to.
        QSqlQuery l(db);
        l.prepare(QStringLiteral("SELECT cmid, reply_to FROM local_messages WHERE conv = ? AND kind = 'send'"
                                 " AND seq IS NULL AND reply_to IS NOT NULL"));
        l.addBindValue(conv);
        if (!exec(l))
            return false;
        while (l.next()) {
            const auto it = byCmid.constFind(l.value(0).toString());
            if (it == byCmid.cend())
                continue;
            rows[*it].replyTo = l.value(1).toLongLong();
            quoted.insert(rows[*it].replyTo);
        }
    }
    if (quoted.isEmpty())
        return true;
    QStringList marks;
    for (qsizetype i = 0; i < quoted.size(); ++i)
        marks << QStringLiteral("?");
    QSqlQuery w(db);
    w.prepare(QStringLiteral("SELECT seq, sender, COALESCE(edit_body, body) FROM events WHERE conv = ? AND kind = 'msg'"
                             " AND seq IN (%1)").arg(marks.join(u',')));
    w.addBindValue(conv);
    for (const qint64 seq : std::as_const(quoted))
        w.addBindValue(seq);
    if (!exec(w))
        return false;
    QHash<qint64, QPair<QString, QString>> found;
    while (w.next())
        found.insert(w.value(0).toLongLong(), {w.value(1).toString(), w.value(2).toString()});
    for (MessageRow &r : rows) {
        const auto it = found.constFind(r.replyTo);
        if (r.replyTo <= 0 || it == found.cend())
            continue;
        r.quoteKnown = true;
        r.quoteSender = it->first;
        r.quoteBody = it->second;
    }
    return true;
}

std::optional<proto::Attachment> Storage::attachment(const QString &attId) {
    error_.clear();
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT name, mime, size, sha256 FROM attachments WHERE att_id = ?"));
    q.addBindValue(attId);
    if (!exec(q) || !q.next())
        return std::nullopt;
    return proto::Attachment{attId, q.value(0).toString(), q.value(1).toString(), q.value(2).toLongLong(),
                             q.value(3).toString()};
}

bool Storage::applyWindow(const proto::Page &page, qint64 before, qint64 gapLo, bool *stale) {
    if (stale)
        *stale = false;
    if (!begin(Durability::Relaxed))
        return false;
    auto abort = [this]() {
        const QString e = error_;
        rollback();
        return fail(e);
    };
    QSqlDatabase db = QSqlDatabase::database(connection_, false);
    if (before > 0) {
        // Older events belong to the cursor's epoch; after a reset (epoch 0)
        // or under a new epoch they would be another history's.
        QSqlQuery c(db);
        c.prepare(QStringLiteral("SELECT epoch FROM conversations WHERE conv = ?"));
        c.addBindValue(page.conv);
        if (!exec(c)) { c = QSqlQuery(); return abort(); }
        const qint64 epoch = c.next() ? c.value(0).toLongLong() : 0;
        c = QSqlQuery();
        if (epoch == 0 || epoch != page.epoch) {
            rollback();
            if (stale)
                *stale = true;
            return true;
        }
    }
    if ((before == 0 && !startRebuild(page.conv, page.head)) || !lookAhead(page.conv, page.events))
        return abort();
    for (const proto::Event &e : page.events)
        if (!insertEvent(e, e.epoch > 0 ? e.epoch : page.epoch))
            return abort();
    endLookAhead();
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
                             " AND kind NOT IN " IM_SQL_NOT_A_ROW " ORDER BY seq DESC LIMIT ?)"));
    q.addBindValue(conv);
    q.addBindValue(below);
    q.addBindValue(count);
    if (!exec(q) || !q.next())
        return std::nullopt;
    return q.value(0).toLongLong();
}

std::optional<bool> Storage::hasEventsBelow(const QString &conv, qint64 seq) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    q.prepare(QStringLiteral("SELECT EXISTS(SELECT 1 FROM events WHERE conv = ? AND seq < ? AND kind NOT IN " IM_SQL_NOT_A_ROW ")"));
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

bool Storage::ownEventRecalled(const QString &conv, qint64 seq, const QString &cmid, const QString &self) {
    QSqlQuery q(QSqlDatabase::database(connection_, false));
    // The join of messages(), for the one event: ours by the cmid it
    // carries (or, stored before schema 4, by our message at its seq and
    // epoch), and a recall event naming it.
    q.prepare(QStringLiteral(
        "SELECT 1 FROM events e WHERE e.conv = :conv AND e.seq = :seq AND e.kind = 'msg' AND e.sender = :self"
        " AND " IM_SQL_OWN_CMID_OF_E " = :cmid AND " IM_SQL_E_RECALLED));
    q.bindValue(QStringLiteral(":conv"), conv);
    q.bindValue(QStringLiteral(":seq"), seq);
    q.bindValue(QStringLiteral(":self"), self);
    q.bindValue(QStringLiteral(":cmid"), cmid);
    return exec(q) && q.next();
}

} // namespace im::detail
