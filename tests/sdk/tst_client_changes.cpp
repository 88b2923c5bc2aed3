// Replies, edits and reactions (contract section 12, obligation 16) against
// the in-process fake server: through the durable outbox, in creation order
// with the messages of their conversation, an edit of an entry never on the
// wire rewriting it, a change waiting behind its target; and the store's
// rule (a change applied only above edit_seq / reactions_seq), checked on
// detail::Storage directly.
#include "tst_client_fixture.h"

#include "storage_p.h"

#include <im/messagelistmodel.h>
#include <im/testing.h>

#include <QtCore/QJsonArray>
#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>

namespace {

const QString c1 = QStringLiteral("c1");

// The request types the fake server received, in order (send/edit/react).
QStringList changeOrder(const FakeServer &server) {
    QStringList out;
    for (const QJsonObject &o : server.received) {
        const QString t = o.value(QStringLiteral("t")).toString();
        if (t == u"send" || t == u"edit" || t == u"react")
            out << t + QLatin1Char(':') + o.value(QStringLiteral("cmid")).toString();
    }
    return out;
}

// The model's row of `seq` by role name (QML's names), or an empty map.
QVariantMap rowOf(const im::MessageListModel &m, qint64 seq) {
    for (int i = 0; i < m.rowCount(); ++i)
        if (m.get(i, QStringLiteral("seq")).toLongLong() == seq)
            return m.get(i);
    return {};
}

QVariantList reactions(const QString &emoji, int count, bool mine) {
    return {QVariantMap{{QStringLiteral("emoji"), emoji}, {QStringLiteral("count"), count}, {QStringLiteral("mine"), mine}}};
}

im::proto::Event msgEvent(qint64 seq, const QString &sender, const QString &body) {
    im::proto::Event e;
    e.conv = c1;
    e.seq = seq;
    e.mid = QStringLiteral("mid-%1").arg(seq);
    e.kind = QStringLiteral("msg");
    e.sender = sender;
    e.body = body;
    e.ts = 1000 + seq;
    e.epoch = 1;
    return e;
}

im::proto::Event changeEvent(qint64 seq, const QString &kind, const QString &sender, qint64 target) {
    im::proto::Event e = msgEvent(seq, sender, {});
    e.kind = kind;
    e.target = target;
    return e;
}

im::proto::Page pageOf(const QList<im::proto::Event> &events, qint64 head) {
    im::proto::Page p;
    p.conv = c1;
    p.events = events;
    p.nextAfter = events.isEmpty() ? 0 : events.last().seq;
    p.head = head;
    p.epoch = 1;
    return p;
}

} // namespace

class TestClientChanges : public QObject {
    Q_OBJECT
private slots:
    void a_reply_carries_reply_to_and_is_stored_with_it();
    void an_edit_of_an_entry_never_on_the_wire_rewrites_it();
    void an_edit_waits_behind_its_target_until_it_has_a_seq();
    void a_change_of_a_failed_target_fails_without_a_request();
    void changes_go_in_creation_order_with_the_messages();
    void terminal_codes_fail_a_change_and_unavailable_retries_it();
    void a_reaction_is_counted_once_and_shown_with_me();
    void bad_input_is_refused_and_queues_nothing();
    void a_reply_lost_by_a_restored_server_is_resent_as_a_reply();
    void the_model_shows_quotes_edits_reactions_and_pending_changes();
    void store_applies_changes_only_above_their_seq();
};

void TestClientChanges::a_reply_carries_reply_to_and_is_stored_with_it() {
    Fixture f;
    f.server.eventsCarryCmid = true;
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("question?"));
    QVERIFY(f.openAndConnect());
    const QString cmid = f.client.reply(c1, 1, QStringLiteral("answer"));
    QVERIFY(!cmid.isEmpty());
    QTRY_COMPARE(f.client.messageState(cmid), MessageState::Sent);
    const QList<QJsonObject> sends = f.server.requests(QStringLiteral("send"));
    QCOMPARE(sends.size(), 1);
    QCOMPARE(sends.at(0).value(QStringLiteral("reply_to")).toInteger(), 1);
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT reply_to FROM events WHERE cmid = ?"), {cmid}).toLongLong(), 2 - 1);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT reply_to FROM local_messages WHERE cmid = ?"), {cmid}).toLongLong(), 1);
}

void TestClientChanges::an_edit_of_an_entry_never_on_the_wire_rewrites_it() {
    Fixture f;
    f.server.eventsCarryCmid = true;
    QVERIFY(f.client.open(f.db)); // offline: nothing goes on the wire yet
    const QString cmid = f.client.send(c1, QStringLiteral("helo"));
    QCOMPARE(f.client.edit(c1, cmid, QStringLiteral("hello")), cmid); // the entry itself
    QCOMPARE(f.outboxRows(), 1);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT body FROM outbox WHERE cmid = ?"), {cmid}).toString(),
             QStringLiteral("hello"));
    f.client.connectToServer();
    QTRY_COMPARE(f.client.messageState(cmid), MessageState::Sent);
    QCOMPARE(f.requestsOf(QStringLiteral("send")), 1);
    QCOMPARE(f.requestsOf(QStringLiteral("edit")), 0);
    QCOMPARE(f.server.requests(QStringLiteral("send")).at(0).value(QStringLiteral("body")).toString(),
             QStringLiteral("hello"));
}

void TestClientChanges::an_edit_waits_behind_its_target_until_it_has_a_seq() {
    Fixture f;
    // Neither a push nor a sync may hand the client its target's seq (an
    // event with our cmid settles the target: then the edit may go).
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("hi"));
    f.server.holdReplies[QStringLiteral("send")] = 1;
    f.server.pushEvents = false;
    QVERIFY(f.openAndConnect());
    const QString target = f.client.send(c1, QStringLiteral("typo"));
    QTRY_COMPARE(f.requestsOf(QStringLiteral("send")), 1); // on the wire, unanswered
    const QString edit = f.client.edit(c1, target, QStringLiteral("fixed"));
    QVERIFY(!edit.isEmpty());
    QVERIFY(edit != target);
    QCOMPARE(f.outboxRows(), 2);
    const QList<im::OutboxEntry> entries = f.client.outbox();
    QCOMPARE(entries.size(), 2);
    QCOMPARE(entries.at(1).kind(), QStringLiteral("edit"));
    QCOMPARE(entries.at(1).targetCmid(), target);
    QCOMPARE(entries.at(1).target(), 0);
    // The target is not answered: the edit has no seq to name and waits.
    QTest::qWait(200);
    QCOMPARE(f.requestsOf(QStringLiteral("edit")), 0);
    f.server.pushEvents = true;
    f.server.releaseHeld();
    QTRY_COMPARE(f.client.messageState(edit), MessageState::Sent);
    const QList<QJsonObject> edits = f.server.requests(QStringLiteral("edit"));
    QCOMPARE(edits.size(), 1);
    QCOMPARE(edits.at(0).value(QStringLiteral("target")).toInteger(), 2);
    QCOMPARE(edits.at(0).value(QStringLiteral("body")).toString(), QStringLiteral("fixed"));
    QCOMPARE(changeOrder(f.server), (QStringList{QStringLiteral("send:") + target, QStringLiteral("edit:") + edit}));
    QCOMPARE(f.outboxRows(), 0);
    // The store shows the edit on its target (by push or sync).
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT edit_body FROM events WHERE conv = 'c1' AND seq = 2")).toString(),
                 QStringLiteral("fixed"));
}

void TestClientChanges::a_change_of_a_failed_target_fails_without_a_request() {
    Fixture f;
    f.server.holdReplies[QStringLiteral("send")] = 1;
    QVERIFY(f.openAndConnect());
    const QString target = f.client.send(c1, QStringLiteral("doomed"));
    QTRY_COMPARE(f.requestsOf(QStringLiteral("send")), 1);
    const QString edit = f.client.edit(c1, target, QStringLiteral("still doomed"));
    const QString react = f.client.react(c1, target, QStringLiteral("👍"), true);
    QVERIFY(!edit.isEmpty() && !react.isEmpty());
    f.server.failWith[QStringLiteral("send")] = QStringLiteral("NOT_MEMBER");
    f.server.holdReplies.clear();
    // The held send is answered (processed before the knob): drop it and
    // resend under the knob instead, by reconnecting.
    f.server.closeAll();
    QTRY_COMPARE(f.client.messageState(target), MessageState::Failed);
    QTRY_COMPARE(f.client.messageState(edit), MessageState::Failed);
    QTRY_COMPARE(f.client.messageState(react), MessageState::Failed);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT error_code FROM local_messages WHERE cmid = ?"), {edit}).toString(),
             QStringLiteral("NOT_FOUND"));
    QCOMPARE(f.requestsOf(QStringLiteral("edit")), 0);
    QCOMPARE(f.requestsOf(QStringLiteral("react")), 0);
    QCOMPARE(f.outboxRows(), 0);
}

void TestClientChanges::changes_go_in_creation_order_with_the_messages() {
    Fixture f;
    f.server.eventsCarryCmid = true;
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("hi"));
    QVERIFY(f.client.open(f.db)); // all queued before the first byte
    const QString m1 = f.client.send(c1, QStringLiteral("one"));
    f.client.connectToServer();
    QTRY_COMPARE(f.client.messageState(m1), MessageState::Sent);
    f.client.disconnectFromServer();
    const QString r = f.client.react(c1, 1, QStringLiteral("🎉"), true);
    QCOMPARE(f.client.outbox().at(0).emoji(), QStringLiteral("🎉"));
    QVERIFY(f.client.outbox().at(0).isOn());
    QCOMPARE(f.client.outbox().at(0).target(), 1);
    const QString m2 = f.client.send(c1, QStringLiteral("two"));
    const QString e = f.client.edit(c1, m1, QStringLiteral("one!"));
    const QString m3 = f.client.send(c1, QStringLiteral("three"));
    f.client.connectToServer();
    QTRY_COMPARE(f.outboxRows(), 0);
    for (const QString &cmid : {r, m2, e, m3})
        QCOMPARE(f.client.messageState(cmid), MessageState::Sent);
    QCOMPARE(changeOrder(f.server),
             (QStringList{QStringLiteral("send:") + m1, QStringLiteral("react:") + r, QStringLiteral("send:") + m2,
                          QStringLiteral("edit:") + e, QStringLiteral("send:") + m3}));
}

void TestClientChanges::terminal_codes_fail_a_change_and_unavailable_retries_it() {
    Fixture f;
    f.server.eventsCarryCmid = true;
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("ben's"));
    QVERIFY(f.openAndConnect());
    const QString notMine = f.client.edit(c1, 1, QStringLiteral("mine now"));
    QTRY_COMPARE(f.client.messageState(notMine), MessageState::Failed);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT error_code FROM local_messages WHERE cmid = ?"), {notMine}).toString(),
             QStringLiteral("NOT_SENDER"));
    const QString own = f.client.send(c1, QStringLiteral("mine"));
    QTRY_COMPARE(f.client.messageState(own), MessageState::Sent);
    f.server.convs[c1].editWindowMs = 0;
    const QString late = f.client.edit(c1, own, QStringLiteral("too late"));
    QTRY_COMPARE(f.client.messageState(late), MessageState::Failed);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT error_code FROM local_messages WHERE cmid = ?"), {late}).toString(),
             QStringLiteral("EDIT_WINDOW_EXPIRED"));
    f.server.convs[c1].editWindowMs = 600000;
    // Retryable: UNAVAILABLE, resent with the same cmid until it lands.
    f.server.unavailable[QStringLiteral("edit")] = 2;
    f.server.unavailable[QStringLiteral("react")] = 1;
    const QString again = f.client.edit(c1, own, QStringLiteral("mine, edited"));
    const QString like = f.client.react(c1, 1, QStringLiteral("👍"), true);
    QTRY_COMPARE(f.client.messageState(again), MessageState::Sent);
    QTRY_COMPARE(f.client.messageState(like), MessageState::Sent);
    int edits = 0, reacts = 0;
    for (const QJsonObject &o : f.server.received) {
        edits += o.value(QStringLiteral("cmid")).toString() == again ? 1 : 0;
        reacts += o.value(QStringLiteral("cmid")).toString() == like ? 1 : 0;
    }
    QCOMPARE(edits, 3);
    QCOMPARE(reacts, 2);
    QCOMPARE(f.outboxRows(), 0);
}

void TestClientChanges::a_reaction_is_counted_once_and_shown_with_me() {
    Fixture f;
    f.server.eventsCarryCmid = true;
    f.server.convs[c1].members << QStringLiteral("cy");
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("react to me"));
    QVERIFY(f.openAndConnect());
    f.client.sync(c1);
    QTRY_COMPARE(f.eventCount(c1), 1);
    const QString like = f.client.react(c1, 1, QStringLiteral("👍"), true);
    QTRY_COMPARE(f.client.messageState(like), MessageState::Sent);
    // Another user's reaction arrives by push; then a full re-sync from 0
    // re-applies every event and the annotated msg: still counted once each.
    QTRY_COMPARE(f.cursor(c1), 2);
    f.server.convs[c1].reactionState.insert(QStringLiteral("cy\n1\n👍"), f.server.convs[c1].head() + 1);
    f.server.appendEvent(c1, QJsonObject{{QStringLiteral("kind"), QStringLiteral("reaction")},
                                             {QStringLiteral("sender"), QStringLiteral("cy")},
                                             {QStringLiteral("target"), 1},
                                             {QStringLiteral("emoji"), QStringLiteral("👍")},
                                             {QStringLiteral("on"), true}});
    QTRY_COMPARE(f.cursor(c1), 3);
    const QString reactionsSql = QStringLiteral("SELECT reactions || '@' || reactions_seq FROM events WHERE conv = 'c1' AND seq = 1");
    const QJsonObject want{{QStringLiteral("emoji"), QStringLiteral("👍")}, {QStringLiteral("count"), 2}, {QStringLiteral("me"), true}};
    const QString expected = QString::fromUtf8(QJsonDocument(QJsonArray{want}).toJson(QJsonDocument::Compact)) + QStringLiteral("@3");
    QCOMPARE(sqlScalar(f.db, reactionsSql).toString(), expected);
    // Re-applying a page from 0 (the cursor dropped) changes nothing.
    f.client.close();
    sqlScalar(f.db, QStringLiteral("UPDATE conversations SET after = 0"));
    QCOMPARE(f.cursor(c1), 0);
    const int syncs = f.requestsOf(QStringLiteral("sync"));
    QVERIFY(f.client.open(f.db));
    f.client.connectToServer(); // syncs from the cursor: 0
    QTRY_VERIFY(f.requestsOf(QStringLiteral("sync")) > syncs);
    QTRY_COMPARE(f.cursor(c1), 3);
    QCOMPARE(sqlScalar(f.db, reactionsSql).toString(), expected);
    // Off again: the count drops, `me` goes.
    const QString unlike = f.client.react(c1, 1, QStringLiteral("👍"), false);
    QTRY_COMPARE(f.client.messageState(unlike), MessageState::Sent);
    QTRY_COMPARE(f.cursor(c1), 4);
    const QJsonObject after{{QStringLiteral("emoji"), QStringLiteral("👍")}, {QStringLiteral("count"), 1}, {QStringLiteral("me"), false}};
    QCOMPARE(sqlScalar(f.db, reactionsSql).toString(),
             QString::fromUtf8(QJsonDocument(QJsonArray{after}).toJson(QJsonDocument::Compact)) + QStringLiteral("@4"));
}

void TestClientChanges::the_model_shows_quotes_edits_reactions_and_pending_changes() {
    Fixture f;
    f.server.eventsCarryCmid = true;
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("hello\nsecond line"));
    QVERIFY(f.openAndConnect());
    im::MessageListModel model(&f.client, c1);
    QTRY_COMPARE(rowOf(model, 1).value(QStringLiteral("body")).toString(), QStringLiteral("hello\nsecond line"));
    const QString answer = f.client.reply(c1, 1, QStringLiteral("answer"));
    QTRY_COMPARE(f.client.messageState(answer), MessageState::Sent);
    QTRY_COMPARE(rowOf(model, 2).value(QStringLiteral("replyTo")).toLongLong(), 1);
    QVariantMap mine = rowOf(model, 2);
    QCOMPARE(mine.value(QStringLiteral("quoteSender")).toString(), QStringLiteral("ben"));
    QCOMPARE(mine.value(QStringLiteral("quoteText")).toString(), QStringLiteral("hello"));
    QVERIFY(!mine.value(QStringLiteral("edited")).toBool());
    QCOMPARE(rowOf(model, 1).value(QStringLiteral("replyTo")).toLongLong(), 0);

    // Pending: shown at once, marked, before the server has answered.
    f.server.holdReplies[QStringLiteral("edit")] = 1;
    f.server.holdReplies[QStringLiteral("react")] = 1;
    f.server.pushEvents = false;
    QVERIFY(!f.client.edit(c1, 2, QStringLiteral("answer, edited")).isEmpty());
    QVERIFY(!f.client.react(c1, 1, QStringLiteral("👍"), true).isEmpty());
    QTRY_COMPARE(rowOf(model, 2).value(QStringLiteral("body")).toString(), QStringLiteral("answer, edited"));
    mine = rowOf(model, 2);
    QVERIFY(mine.value(QStringLiteral("edited")).toBool());
    QVERIFY(mine.value(QStringLiteral("changePending")).toBool());
    QTRY_COMPARE(rowOf(model, 1).value(QStringLiteral("reactions")).toList(), reactions(QStringLiteral("👍"), 1, true));
    QVERIFY(rowOf(model, 1).value(QStringLiteral("changePending")).toBool());

    // Confirmed and stored: the same, no longer pending.
    f.server.pushEvents = true;
    f.server.releaseHeld();
    f.client.sync(c1);
    QTRY_COMPARE(f.outboxRows(), 0);
    QTRY_COMPARE(f.cursor(c1), 4);
    QTRY_VERIFY(!rowOf(model, 2).value(QStringLiteral("changePending")).toBool());
    QTRY_VERIFY(!rowOf(model, 1).value(QStringLiteral("changePending")).toBool());
    QCOMPARE(rowOf(model, 2).value(QStringLiteral("body")).toString(), QStringLiteral("answer, edited"));
    QVERIFY(rowOf(model, 2).value(QStringLiteral("edited")).toBool());
    QCOMPARE(rowOf(model, 1).value(QStringLiteral("reactions")).toList(), reactions(QStringLiteral("👍"), 1, true));

    // A quote the store does not hold is fetched (once) and shown.
    sqlScalar(f.db, QStringLiteral("DELETE FROM events WHERE conv = 'c1' AND seq = 1"));
    model.refresh();
    QTRY_COMPARE(f.requestsOf(QStringLiteral("fetch")), 1);
    QCOMPARE(f.server.requests(QStringLiteral("fetch")).at(0).value(QStringLiteral("seq")).toInteger(), 1);
    QTRY_COMPARE(rowOf(model, 2).value(QStringLiteral("quoteSender")).toString(), QStringLiteral("ben"));
    QCOMPARE(rowOf(model, 2).value(QStringLiteral("quoteText")).toString(), QStringLiteral("hello"));
    model.refresh();
    QCOMPARE(f.requestsOf(QStringLiteral("fetch")), 1);
}

// Issue 48's restored server (Storage::requeueLostOwn): our lost messages go
// back into the outbox; a reply must stay a reply (same cmid, same reply_to).
void TestClientChanges::a_reply_lost_by_a_restored_server_is_resent_as_a_reply() {
    Fixture f;
    f.server.eventsCarryCmid = true;
    QVERIFY(f.openAndConnect());
    const QString one = f.client.send(c1, QStringLiteral("one"));
    QTRY_COMPARE(f.client.messageState(one), MessageState::Sent);
    const QString two = f.client.reply(c1, 1, QStringLiteral("two"));
    QTRY_COMPARE(f.client.messageState(two), MessageState::Sent);
    QTRY_COMPARE(f.cursor(c1), 2);
    im::testing::Faults(&f.client).setOffline(true);
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Disconnected);
    FakeServer::Conv &conv = f.server.convs[c1]; // restored: only seq 1 left, with its key
    conv.events.resize(1);
    for (auto it = conv.keys.begin(); it != conv.keys.end();)
        it = it.value() > 1 ? conv.keys.erase(it) : std::next(it);
    const int sendsBefore = f.requestsOf(QStringLiteral("send"));
    im::testing::Faults(&f.client).setOffline(false);
    QTRY_COMPARE(f.server.convs[c1].head(), 2);
    QTRY_COMPARE(f.outboxRows(), 0);
    const auto sends = f.server.requests(QStringLiteral("send"));
    QCOMPARE(sends.size(), sendsBefore + 1);
    QCOMPARE(sends.last().value(QStringLiteral("cmid")).toString(), two);
    QCOMPARE(sends.last().value(QStringLiteral("reply_to")).toInteger(), 1);
    QCOMPARE(f.server.convs[c1].events.at(1).value(QStringLiteral("reply_to")).toInteger(), 1);
}

void TestClientChanges::bad_input_is_refused_and_queues_nothing() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    QVERIFY(f.client.reply(c1, 0, QStringLiteral("x")).isEmpty());
    QVERIFY(f.client.reply(c1, 1, QString()).isEmpty());
    QVERIFY(f.client.edit(c1, qint64(0), QStringLiteral("x")).isEmpty());
    QVERIFY(f.client.edit(c1, qint64(3), QString()).isEmpty());
    QVERIFY(f.client.edit(c1, QStringLiteral("no-such-cmid"), QStringLiteral("x")).isEmpty());
    QVERIFY(f.client.react(c1, 1, QString(), true).isEmpty());
    QVERIFY(f.client.react(c1, 1, QString(65, u'a'), true).isEmpty());
    QVERIFY(f.client.react(c1, 1, QStringLiteral("a\nb"), true).isEmpty());
    QVERIFY(f.client.react(QStringLiteral("bad conv!"), 1, QStringLiteral("👍"), true).isEmpty());
    QCOMPARE(f.outboxRows(), 0);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT COUNT(*) FROM local_messages")).toLongLong(), 0);
}

void TestClientChanges::store_applies_changes_only_above_their_seq() {
    QTemporaryDir dir;
    im::detail::Storage st;
    QVERIFY2(st.open(dir.filePath(QStringLiteral("s.db"))), qPrintable(st.lastError()));
    QVERIFY(st.setMeta(QStringLiteral("user"), QStringLiteral("ana")));
    using im::proto::Event;
    Event e3 = changeEvent(3, QStringLiteral("edit"), QStringLiteral("ben"), 1);
    e3.body = QStringLiteral("second");
    Event e2 = changeEvent(2, QStringLiteral("edit"), QStringLiteral("ben"), 1);
    e2.body = QStringLiteral("first");
    Event r4 = changeEvent(4, QStringLiteral("reaction"), QStringLiteral("ana"), 1);
    r4.emoji = QStringLiteral("👍");
    r4.on = true;
    Event r5 = changeEvent(5, QStringLiteral("reaction"), QStringLiteral("cy"), 1);
    r5.emoji = QStringLiteral("👍");
    r5.on = true;
    const QString dbPath = dir.filePath(QStringLiteral("s.db"));
    auto row = [&] {
        return sqlScalar(dbPath, QStringLiteral("SELECT COALESCE(edit_body, body) || '|' || COALESCE(edit_seq, 0) || '|'"
                                                " || COALESCE(reactions, '') || '|' || COALESCE(reactions_seq, 0)"
                                                " FROM events WHERE conv = 'c1' AND seq = 1"))
            .toString();
    };
    const QString both = QStringLiteral("second|3|[{\"count\":2,\"emoji\":\"👍\",\"me\":true}]|5");
    // In order: each applied once.
    QVERIFY(st.applyPage(pageOf({msgEvent(1, QStringLiteral("ben"), QStringLiteral("orig")), e2, e3, r4, r5}, 5)));
    QCOMPARE(row(), both);
    // The same page again (a crash before the cursor, C7): harmless.
    QVERIFY(st.applyPage(pageOf({msgEvent(1, QStringLiteral("ben"), QStringLiteral("orig")), e2, e3, r4, r5}, 5)));
    QCOMPARE(row(), both);
    // The msg again as an older snapshot (a page read before the changes):
    // what is stored is newer and stays.
    Event stale = msgEvent(1, QStringLiteral("ben"), QStringLiteral("orig"));
    stale.editSeq = 2;
    stale.editBody = QStringLiteral("first");
    stale.reactions = {{QStringLiteral("👍"), 1, true}};
    stale.reactionsSeq = 4;
    QVERIFY(st.applyPage(pageOf({stale}, 5)));
    QCOMPARE(row(), both);
    // A newer snapshot wins over what is stored.
    Event fresh = msgEvent(1, QStringLiteral("ben"), QStringLiteral("orig"));
    fresh.editSeq = 9;
    fresh.editBody = QStringLiteral("third");
    fresh.reactions = {{QStringLiteral("❤"), 4, false}};
    fresh.reactionsSeq = 10;
    QVERIFY(st.applyPage(pageOf({fresh}, 10)));
    QCOMPARE(row(), QStringLiteral("third|9|[{\"count\":4,\"emoji\":\"❤\",\"me\":false}]|10"));
    // Events at or below those seqs (older edits, reactions) change nothing.
    QVERIFY(st.applyPage(pageOf({e2, e3, r4, r5}, 10)));
    QCOMPARE(row(), QStringLiteral("third|9|[{\"count\":4,\"emoji\":\"❤\",\"me\":false}]|10"));
    // Edit and reaction events are no timeline rows.
    const auto rows = st.messages(c1, QStringLiteral("ana"));
    QVERIFY(rows);
    QCOMPARE(rows->size(), 1);
    QCOMPARE(rows->at(0).body, QStringLiteral("third"));
    QVERIFY(rows->at(0).edited);
    QCOMPARE(rows->at(0).reactions.size(), 1);
}

QTEST_GUILESS_MAIN(TestClientChanges)
#include "tst_client_changes.moc"
