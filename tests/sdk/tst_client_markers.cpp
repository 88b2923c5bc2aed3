// im::Client against an in-process fake server (tst_client_fixture.h):
// markers, unread counts, hints, recall and the models that show them.
// One test per obligation of docs/sdk.md / spec sdk.md, each written so
// that breaking the obligation it names makes it fail.
#include "client_p.h"
#include "fakeserver.h"
#include "sdktestutil.h"
#include "tst_client_fixture.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>
#include <im/outboxmodel.h>
#include <im/testing.h>

#include <QtCore/QElapsedTimer>
#include <QtCore/QJsonArray>
#include <QtCore/QTemporaryDir>
#include <QtCore/QUuid>
#include <QtNetwork/QTcpServer>
#include <QtSql/QSqlDatabase>
#include <QtSql/QSqlError>
#include <QtSql/QSqlQuery>
#include <QtTest/QtTest>

class TestClientMarkers : public QObject {
    Q_OBJECT
private slots:
    void hint_triggers_sync_and_updates_the_read_marker();
    void recall_goes_through_the_outbox_and_the_target_shows_recalled();
    void mark_read_sends_read_and_records_the_marker();
    void message_model_shows_pending_at_once_then_sent_and_others_messages();
    void conversation_model_exposes_markers();
    void recalled_lookup_is_an_index_search();
    void unread_badge_is_the_servers_count_also_across_a_gap();
    // Issue 48: a push costs one sync, not a walk of every conversation.
    void hints_and_read_ok_move_the_badge_without_a_convs_walk();
    void an_unknown_conversation_in_a_hint_is_discovered_by_a_walk();
    void convs_refreshes_are_rate_limited();
    void a_read_the_stored_rows_cannot_count_takes_the_servers_count();
};

namespace {

QJsonObject hintFrame(const QString &conv, qint64 head, std::optional<qint64> read = std::nullopt) {
    QJsonObject h{{QStringLiteral("t"), QStringLiteral("hint")},
                  {QStringLiteral("conv"), conv},
                  {QStringLiteral("head"), head},
                  {QStringLiteral("epoch"), 1}};
    if (read)
        h.insert(QStringLiteral("read"), *read);
    return h;
}

// The session's own walk (and the syncs it started) is over, and no
// refresh of the list is pending.
bool settled(Fixture &f) {
    const im::Sync &sync = im::ClientPrivate::get(&f.client)->sync;
    return f.requestsOf(QStringLiteral("convs")) >= 1 && !sync.isWalkingConvs() && sync.activeSyncs() == 0
           && !sync.convsRefreshPending();
}

} // namespace

// Issue 48. Every hint and every read_ok used to schedule a walk of the
// whole conversation list (10 pages for a user in 1,000 conversations, per
// message of a large group). The hint's sync moves the badge (arrivals above
// unread_head), and a read part of the way is counted from the stored rows:
// no `convs` request, none scheduled, and the badge is the server's count.
void TestClientMarkers::hints_and_read_ok_move_the_badge_without_a_convs_walk() {
    Fixture f;
    const QString c1 = QStringLiteral("c1");
    f.server.pushEvents = false; // a group above push_full_max: hints only
    QVERIFY(f.openAndConnect());
    QTRY_VERIFY(settled(f));
    const int walksBefore = f.requestsOf(QStringLiteral("convs"));
    for (int i = 1; i <= 20; ++i) {
        const qint64 seq = f.server.append(c1, QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
        f.server.pushToAll(hintFrame(c1, seq));
    }
    QTRY_COMPARE(f.cursor(c1), 20);
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT unread FROM conversations WHERE conv = 'c1'")).toLongLong(), 20);
    // Another device of ana's read up to 5: the hint carries it.
    f.server.convs[c1].read.insert(QStringLiteral("ana"), 5);
    f.server.pushToAll(hintFrame(c1, 20, 5));
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT read FROM conversations WHERE conv = 'c1'")).toLongLong(), 5);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT unread FROM conversations WHERE conv = 'c1'")).toLongLong(), 15);
    // This device reads up to 12: read_ok, counted locally too.
    QVERIFY(f.client.markRead(c1, 12));
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT read FROM conversations WHERE conv = 'c1'")).toLongLong(), 12);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT unread FROM conversations WHERE conv = 'c1'")).toLongLong(), 8);
    QTRY_VERIFY(settled(f)); // nothing pending: a scheduled walk would show here
    QCOMPARE(f.requestsOf(QStringLiteral("convs")), walksBefore);
    // And the badge is the server's own count: a walk changes nothing.
    im::ClientPrivate::get(&f.client)->sync.requestConvs();
    QTRY_COMPARE(f.requestsOf(QStringLiteral("convs")), walksBefore + 1);
    QTRY_VERIFY(settled(f));
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT unread FROM conversations WHERE conv = 'c1'")).toLongLong(), 8);
}

// Issue 48: a hint for a conversation no walk has listed (added to it just
// now) still brings its kind and the server's count, by one walk.
void TestClientMarkers::an_unknown_conversation_in_a_hint_is_discovered_by_a_walk() {
    Fixture f;
    f.server.pushEvents = false;
    QVERIFY(f.openAndConnect());
    QTRY_VERIFY(settled(f));
    const int walksBefore = f.requestsOf(QStringLiteral("convs"));
    const QString c2 = QStringLiteral("c2");
    f.server.convs[c2].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    f.server.convs[c2].kind = QStringLiteral("direct");
    for (int i = 1; i <= 3; ++i)
        f.server.append(c2, QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    f.server.pushToAll(hintFrame(c2, 3));
    QTRY_COMPARE(f.cursor(c2), 3);
    QTRY_COMPARE_WITH_TIMEOUT(
        sqlScalar(f.db, QStringLiteral("SELECT kind FROM conversations WHERE conv = 'c2'")).toString(),
        QStringLiteral("direct"), 15000);
    QTRY_VERIFY(settled(f));
    QCOMPARE(f.requestsOf(QStringLiteral("convs")), walksBefore + 1);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT unread FROM conversations WHERE conv = 'c2'")).toLongLong(), 3);
}

// Issue 48: whatever asks for the list (unknown conversations one after
// another), a walk starts no sooner than convsMinIntervalMs after the last.
// Hints for 12 unknown conversations, 300 ms apart (more than the 200 ms
// coalescing, so without the limit each costs a walk); every one is
// discovered, with at most one walk per interval of the time it took
// (plus the first and the last: an upper bound only, a slow machine only
// makes it looser).
void TestClientMarkers::convs_refreshes_are_rate_limited() {
    Fixture f;
    f.server.pushEvents = false;
    QVERIFY(f.openAndConnect());
    im::Sync &sync = im::ClientPrivate::get(&f.client)->sync;
    constexpr int interval = 1500, n = 12;
    sync.convsMinIntervalMs = interval;
    QTRY_VERIFY(settled(f));
    const quint64 walksBefore = sync.convsWalks();
    QElapsedTimer clock;
    clock.start();
    for (int i = 0; i < n; ++i) {
        const QString conv = QStringLiteral("n%1").arg(i);
        f.server.convs[conv].members = {QStringLiteral("ana"), QStringLiteral("ben")};
        const qint64 seq = f.server.append(conv, QStringLiteral("ben"), QStringLiteral("hello"));
        f.server.pushToAll(hintFrame(conv, seq));
        QTest::qWait(300); // paces the input; nothing is asserted on it
    }
    const auto discovered = [&] {
        return sqlScalar(f.db, QStringLiteral("SELECT COUNT(*) FROM conversations WHERE conv LIKE 'n%' AND kind = 'group'"))
                   .toInt()
               == n;
    };
    QTRY_VERIFY_WITH_TIMEOUT(discovered(), 30000);
    QTRY_VERIFY(settled(f));
    const qint64 elapsed = clock.elapsed();
    const quint64 walks = sync.convsWalks() - walksBefore;
    qInfo("%llu walks for %d unknown conversations in %lld ms (interval %d ms)", walks, n, elapsed, interval);
    QVERIFY(walks >= 1);
    QVERIFY2(walks <= quint64(2 + elapsed / interval), qPrintable(QStringLiteral("%1 walks in %2 ms").arg(walks).arg(elapsed)));
}

void TestClientMarkers::hint_triggers_sync_and_updates_the_read_marker() {
    Fixture f;
    QSignalSpy synced(&f.client, &im::Client::conversationSynced);
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.server.subscribedCount(), 1);
    // The session's own sync of c1 answered, so that only the hint can fetch
    // what is appended next.
    QTRY_VERIFY(!synced.isEmpty() && synced.last().at(0).toString() == QStringLiteral("c1"));
    const int syncsBefore = f.requestsOf(QStringLiteral("sync"));
    f.server.pushEvents = false;
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b1"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b2"));
    f.server.pushToAll({{QStringLiteral("t"), QStringLiteral("hint")},
                        {QStringLiteral("conv"), QStringLiteral("c1")},
                        {QStringLiteral("head"), 2},
                        {QStringLiteral("epoch"), 1},
                        {QStringLiteral("read"), 1}});
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 2);
    QVERIFY(f.requestsOf(QStringLiteral("sync")) > syncsBefore);
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT read FROM conversations WHERE conv = 'c1'")).toLongLong(), 1);
}

void TestClientMarkers::recall_goes_through_the_outbox_and_the_target_shows_recalled() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    im::MessageListModel model(&f.client, QStringLiteral("c1"));
    const QString msg = f.client.send(QStringLiteral("c1"), QStringLiteral("oops"));
    QTRY_COMPARE(f.client.messageState(msg), MessageState::Sent);
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 1);
    bool durable = false;
    f.server.onFrame = [&](const QJsonObject &req) {
        if (req.value(QStringLiteral("t")).toString() == u"recall")
            durable = sqlScalar(f.db, QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid = ? AND kind = 'recall'"
                                                     " AND target = 1"),
                                {req.value(QStringLiteral("cmid")).toString()})
                          .toInt() == 1;
    };
    QSignalSpy states(&f.client, &Client::messageStateChanged);
    const QString rc = f.client.recall(QStringLiteral("c1"), 1);
    QVERIFY(!rc.isEmpty() && rc != msg);
    QTRY_COMPARE(f.server.requests(QStringLiteral("recall")).size(), 1);
    QVERIFY(durable);
    QCOMPARE(f.server.requests(QStringLiteral("recall")).first().value(QStringLiteral("target")).toInteger(), 1);
    QTRY_COMPARE(f.client.messageState(msg), MessageState::Recalled);
    QTRY_COMPARE(model.count(), 1);
    QTRY_COMPARE(model.get(0, im::MessageListModel::StateRole).toInt(), int(MessageState::Recalled));
    bool sawRecalled = false;
    for (const auto &s : states)
        sawRecalled = sawRecalled || (s.at(1).toString() == msg && s.at(3).value<MessageState>() == MessageState::Recalled);
    QVERIFY(sawRecalled);
    QCOMPARE(f.client.messageState(rc), MessageState::Sent);
}

void TestClientMarkers::mark_read_sends_read_and_records_the_marker() {
    Fixture f;
    for (int i = 1; i <= 3; ++i)
        f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 3);
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT unread FROM conversations WHERE conv = 'c1'")).toLongLong(), 3);
    QVERIFY(f.client.markRead(QStringLiteral("c1"), 2));
    QTRY_COMPARE(f.server.requests(QStringLiteral("read")).size(), 1);
    QCOMPARE(f.server.requests(QStringLiteral("read")).first().value(QStringLiteral("seq")).toInteger(), 2);
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT read FROM conversations WHERE conv = 'c1'")).toLongLong(), 2);
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT unread FROM conversations WHERE conv = 'c1'")).toLongLong(), 1);
    // Offline: remembered and sent after the next hello.
    im::testing::Faults(&f.client).setOffline(true);
    QVERIFY(f.client.markRead(QStringLiteral("c1"), 3));
    im::testing::Faults(&f.client).setOffline(false);
    QTRY_COMPARE(f.server.requests(QStringLiteral("read")).size(), 2);
    QTRY_COMPARE(f.server.convs[QStringLiteral("c1")].read.value(QStringLiteral("ana")), 3);
}

void TestClientMarkers::message_model_shows_pending_at_once_then_sent_and_others_messages() {
    Fixture f;
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("from ben"));
    QVERIFY(f.client.open(f.db));
    im::MessageListModel model(&f.client, QStringLiteral("c1"));
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("mine"));
    QCOMPARE(model.count(), 1); // before send() returned (obligation 1), not after a timer
    QCOMPARE(model.get(0, im::MessageListModel::StateRole).toInt(), int(MessageState::Pending));
    QCOMPARE(model.get(0, im::MessageListModel::CmidRole).toString(), cmid);
    QCOMPARE(model.get(0, im::MessageListModel::BodyRole).toString(), QStringLiteral("mine"));
    QCOMPARE(model.get(0, im::MessageListModel::IsOwnRole).toBool(), true);
    QCOMPARE(model.get(0, im::MessageListModel::SeqRole).toLongLong(), 0);
    f.client.connectToServer();
    // Newest first (obligation 15): ours (seq 2) at row 0, ben's (seq 1) below.
    QTRY_COMPARE(model.count(), 2);
    QTRY_COMPARE(model.get(0, im::MessageListModel::StateRole).toInt(), int(MessageState::Sent));
    QCOMPARE(model.get(1, im::MessageListModel::SenderRole).toString(), QStringLiteral("ben"));
    QCOMPARE(model.get(1, im::MessageListModel::IsOwnRole).toBool(), false);
    QCOMPARE(model.get(1, im::MessageListModel::SeqRole).toLongLong(), 1);
    QCOMPARE(model.get(0, im::MessageListModel::CmidRole).toString(), cmid);
    QTRY_COMPARE(model.get(0, im::MessageListModel::SeqRole).toLongLong(), 2);
    QCOMPARE(model.get(0, im::MessageListModel::DupRole).toBool(), false);
    QVERIFY(model.roleNames().values().contains("errorCode"));
}

void TestClientMarkers::conversation_model_exposes_markers() {
    Fixture f;
    f.server.convs[QStringLiteral("c1")].kind = QStringLiteral("direct");
    for (int i = 1; i <= 4; ++i)
        f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    f.server.convs[QStringLiteral("c1")].read[QStringLiteral("ana")] = 1;
    im::ConversationListModel model(&f.client);
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(model.count(), 1);
    QTRY_COMPARE(model.get(0, im::ConversationListModel::CursorRole).toLongLong(), 4);
    QTRY_COMPARE(model.get(0, im::ConversationListModel::DeliveredRole).toLongLong(), 4);
    QCOMPARE(model.get(0, im::ConversationListModel::ConvRole).toString(), QStringLiteral("c1"));
    QCOMPARE(model.get(0, im::ConversationListModel::KindRole).toString(), QStringLiteral("direct"));
    QCOMPARE(model.get(0, im::ConversationListModel::HeadRole).toLongLong(), 4);
    QCOMPARE(model.get(0, im::ConversationListModel::ReadRole).toLongLong(), 1);
    QCOMPARE(model.get(0, im::ConversationListModel::UnreadRole).toLongLong(), 3);
    QCOMPARE(model.get(0, im::ConversationListModel::EpochRole).toLongLong(), 1);
    QCOMPARE(model.get(0, im::ConversationListModel::HasGapRole).toBool(), false);
}

// "Is seq recalled?" (every model row, every unread recount) must be an index
// search, not a scan of the conversation: a scan made a full sync cubic.
void TestClientMarkers::recalled_lookup_is_an_index_search() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    f.client.close();
    QStringList plan;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("plan"));
        db.setDatabaseName(f.db);
        QVERIFY(db.open());
        QSqlQuery q(db);
        QVERIFY(q.exec(QStringLiteral("EXPLAIN QUERY PLAN SELECT 1 FROM events r"
                                      " WHERE r.conv = 'c1' AND r.kind = 'recall' AND r.target = 7")));
        while (q.next())
            plan << q.value(3).toString();
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("plan"));
    QCOMPARE(plan.size(), 1);
    QVERIFY2(plan.first().contains(QStringLiteral("target=?")), qPrintable(plan.first()));
}

// Issue 26 item 5. Ten unread messages, of which the client downloads only
// the newest window (2): the badge is the server's 10, not a local recount
// of what happens to be stored; new messages add to it, reading clears it.
void TestClientMarkers::unread_badge_is_the_servers_count_also_across_a_gap() {
    Fixture f;
    const QString c1 = QStringLiteral("c1");
    f.client.setBacklogLimit(3);
    f.client.setHistoryWindow(2);
    for (int i = 1; i <= 10; ++i)
        f.server.append(c1, QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    const auto unread = [&] {
        return sqlScalar(f.db, QStringLiteral("SELECT unread FROM conversations WHERE conv = ?"), {c1}).toLongLong();
    };
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(c1), 10);
    QCOMPARE(f.eventCount(c1), 2); // a gap below the window
    QCOMPARE(unread(), 10);
    QTRY_COMPARE(f.server.subscribedCount(), 1);
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("b11")); // pushed
    QTRY_COMPARE(f.cursor(c1), 11);
    QCOMPARE(unread(), 11);
    const QString mine = f.client.send(c1, QStringLiteral("my own counts for nobody"));
    QTRY_COMPARE(f.cursor(c1), 12);
    QCOMPARE(unread(), 11);
    QTRY_COMPARE(f.client.messageState(mine), MessageState::Sent);
    // Another device of ana's read b1..b5: the server's count is now 6, a
    // number neither the local badge (11) nor a recount of the stored rows
    // (b9, b10, b11: 3) gives. After a resync the badge must be the server's.
    f.server.convs[c1].read[QStringLiteral("ana")] = 5;
    const int convsBefore = f.requestsOf(QStringLiteral("convs"));
    f.server.pushToAll({{QStringLiteral("t"), QStringLiteral("resync")}}); // the server's count again
    QTRY_VERIFY(f.requestsOf(QStringLiteral("convs")) > convsBefore);
    QTRY_COMPARE(unread(), 6);
    QVERIFY(f.client.markRead(c1, 12));
    QTRY_COMPARE(unread(), 0);
}

// Issue 48: a read part of the way into a gap (the window holds b9, b10;
// b1..b8 were never loaded) cannot be counted from the stored rows: one
// walk brings the server's count (b6..b10: 5), not a recount of what is
// stored (2) nor the old badge (10).
void TestClientMarkers::a_read_the_stored_rows_cannot_count_takes_the_servers_count() {
    Fixture f;
    const QString c1 = QStringLiteral("c1");
    f.client.setBacklogLimit(3);
    f.client.setHistoryWindow(2);
    f.server.pushEvents = false;
    for (int i = 1; i <= 10; ++i)
        f.server.append(c1, QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    const auto unread = [&] {
        return sqlScalar(f.db, QStringLiteral("SELECT unread FROM conversations WHERE conv = ?"), {c1}).toLongLong();
    };
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(c1), 10);
    QCOMPARE(f.eventCount(c1), 2);
    QTRY_VERIFY(settled(f));
    QCOMPARE(unread(), 10);
    const int walksBefore = f.requestsOf(QStringLiteral("convs"));
    f.server.convs[c1].read.insert(QStringLiteral("ana"), 5);
    f.server.pushToAll(hintFrame(c1, 10, 5));
    QTRY_COMPARE_WITH_TIMEOUT(unread(), 5, 15000);
    QTRY_VERIFY(settled(f));
    QCOMPARE(f.requestsOf(QStringLiteral("convs")), walksBefore + 1);
}

QTEST_GUILESS_MAIN(TestClientMarkers)
#include "tst_client_markers.moc"
