// im::Client against an in-process fake server (tst_client_fixture.h):
// sync and history: pages applied whole or not at all, paging and acks, gaps, epoch changes, a
// cursor ahead of the server (restores), pushes out of order, resync, own messages matched by cmid.
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

class TestClientSync : public QObject {
    Q_OBJECT
private slots:
    void interrupted_page_apply_keeps_the_old_cursor_and_no_events();
    void a_page_cut_at_any_statement_leaves_all_of_it_or_none();
    void sync_loops_while_has_more_and_acks_the_highest_applied_seq();
    void trimmed_page_records_a_permanent_gap();
    void epoch_changed_drops_local_events_and_rebuilds_from_zero();
    void cursor_ahead_drops_the_cursor_and_rebuilds();
    void out_of_order_event_push_is_not_applied_but_triggers_sync();
    void resync_syncs_every_conversation();
    // Issue 26, items 2, 5, 6, 13.
    void a_server_restored_with_a_loss_above_the_backlog_limit_converges_without_a_loop();
    void a_server_restored_with_a_loss_below_the_backlog_limit_drops_the_lost_events();
    void own_messages_are_matched_by_cmid_not_by_seq();
    void a_draft_whose_own_event_is_stored_before_its_answer_is_shown_once();
    void an_older_window_of_a_void_epoch_is_not_stored();
    void a_sent_file_keeps_its_attachment_until_its_event_is_stored();
    // Issue 48: a restored server.
    void a_convs_walk_notices_a_restored_server_and_resends_the_lost_own_messages_once();
};

void TestClientSync::interrupted_page_apply_keeps_the_old_cursor_and_no_events() {
    Fixture f;
    for (int i = 1; i <= 5; ++i)
        f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 5);
    // Five more arrive; the page that carries them fails on its 3rd insert.
    f.server.pushEvents = false;
    for (int i = 6; i <= 10; ++i)
        f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    f.client.setRetryBackoff(1000, 1000);
    im::ClientPrivate::get(&f.client)->storage.injectEventInsertFault(3);
    QSignalSpy errors(&f.client, &Client::errorOccurred);
    f.client.sync(QStringLiteral("c1"));
    QTRY_COMPARE(errors.size(), 1);
    QCOMPARE(errors.at(0).at(0).toString(), QStringLiteral("STORAGE_ERROR"));
    // Nothing of the page is visible: old cursor, old events.
    QCOMPARE(f.cursor(QStringLiteral("c1")), 5);
    QCOMPARE(f.eventCount(QStringLiteral("c1")), 5);
    // The retry applies the whole page.
    QTRY_COMPARE_WITH_TIMEOUT(f.cursor(QStringLiteral("c1")), 10, 5000);
    QCOMPARE(f.eventCount(QStringLiteral("c1")), 10);
}

// Obligation 5 at every cut point: a storage fault at the k-th write
// statement from the events' arrival on, for k = 1..40 (the page's own
// statements and those around it). Each cut leaves the old page (cursor,
// events, unread badge) or the whole new one, never a mix: the events, the
// cursor and the unread count are one transaction.
void TestClientSync::a_page_cut_at_any_statement_leaves_all_of_it_or_none() {
    const QString c1 = QStringLiteral("c1");
    int cuts = 0, whole = 0;
    for (int k = 1; k <= 40; ++k) {
        Fixture f;
        for (int i = 1; i <= 5; ++i)
            f.server.append(c1, QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
        QVERIFY(f.openAndConnect());
        QTRY_COMPARE(f.cursor(c1), 5);
        // cursor, events, unread: read in one statement, one snapshot
        auto state = [&] {
            QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("cutpoint"));
            db.setDatabaseName(f.db);
            QList<qint64> out;
            if (db.open()) {
                QSqlQuery q(db);
                q.prepare(QStringLiteral("SELECT after, (SELECT COUNT(*) FROM events e WHERE e.conv = c.conv), unread"
                                         " FROM conversations c WHERE conv = ?"));
                q.addBindValue(c1);
                if (q.exec() && q.next())
                    out = {q.value(0).toLongLong(), q.value(1).toLongLong(), q.value(2).toLongLong()};
            }
            db = QSqlDatabase();
            QSqlDatabase::removeDatabase(QStringLiteral("cutpoint"));
            return out;
        };
        QTRY_COMPARE(state(), (QList<qint64>{5, 5, 5}));
        f.client.setRetryBackoff(60000, 60000); // no retry while the state is read
        QSignalSpy errors(&f.client, &Client::errorOccurred);
        // The fault first, then the events: whatever the client does on
        // their arrival (a hint, the sync below) runs with the fault armed.
        im::ClientPrivate::get(&f.client)->storage.injectFaultAfter(k);
        f.server.pushEvents = false;
        for (int i = 6; i <= 10; ++i)
            f.server.append(c1, QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
        f.client.sync(c1);
        QTRY_VERIFY(!errors.isEmpty() || f.cursor(c1) == 10);
        const QList<qint64> now = state();
        QCOMPARE(now.size(), 3);
        const qint64 cursor = now[0], events = now[1], badge = now[2];
        const QString at = QStringLiteral("fault at statement %1: cursor %2, events %3, unread %4")
                               .arg(k).arg(cursor).arg(events).arg(badge);
        if (cursor == 5) {
            QVERIFY2(events == 5 && badge == 5, qPrintable(at));
            ++cuts;
        } else {
            QVERIFY2(cursor == 10 && events == 10 && badge == 10, qPrintable(at));
            ++whole;
        }
    }
    qInfo("%d cuts left the old page, %d faults came after the whole page", cuts, whole);
    // Both outcomes were met: cuts inside the page, and faults past it.
    QVERIFY2(cuts >= 8 && whole >= 1, qPrintable(QStringLiteral("%1 cuts, %2 whole").arg(cuts).arg(whole)));
}

void TestClientSync::sync_loops_while_has_more_and_acks_the_highest_applied_seq() {
    Fixture f;
    for (int i = 1; i <= 25; ++i)
        f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    f.client.setSyncPageSize(10);
    QSignalSpy synced(&f.client, &Client::conversationSynced);
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(synced.size(), 1);
    QCOMPARE(f.cursor(QStringLiteral("c1")), 25);
    QCOMPARE(f.eventCount(QStringLiteral("c1")), 25);
    const auto syncs = f.server.requests(QStringLiteral("sync"));
    QCOMPARE(syncs.size(), 3);
    QCOMPARE(syncs[0].value(QStringLiteral("after")).toInteger(), 0);
    QCOMPARE(syncs[1].value(QStringLiteral("after")).toInteger(), 10);
    QCOMPARE(syncs[2].value(QStringLiteral("after")).toInteger(), 20);
    QCOMPARE(syncs[1].value(QStringLiteral("epoch")).toInteger(), 1);
    QTRY_COMPARE(f.server.convs[QStringLiteral("c1")].delivered.value(QStringLiteral("ana-d1")), 25);
    const auto acks = f.server.requests(QStringLiteral("ack"));
    QCOMPARE(acks.last().value(QStringLiteral("seq")).toInteger(), 25);
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT delivered FROM conversations WHERE conv = 'c1'")).toLongLong(), 25);
}

void TestClientSync::trimmed_page_records_a_permanent_gap() {
    Fixture f;
    for (int i = 1; i <= 10; ++i)
        f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    f.server.convs[QStringLiteral("c1")].minSeq = 6;
    im::ConversationListModel convs(&f.client);
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 10);
    QCOMPARE(f.eventCount(QStringLiteral("c1")), 5);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT gap_to FROM conversations WHERE conv = 'c1'")).toLongLong(), 5);
    QTRY_COMPARE(convs.indexOf(QStringLiteral("c1")), 0);
    QTRY_COMPARE(convs.get(0, im::ConversationListModel::HasGapRole).toBool(), true);
}

void TestClientSync::epoch_changed_drops_local_events_and_rebuilds_from_zero() {
    Fixture f;
    for (int i = 1; i <= 3; ++i)
        f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("old%1").arg(i));
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 3);
    // The server rebuilds the conversation under epoch 2 with other content.
    f.server.pushEvents = false;
    FakeServer::Conv &c = f.server.convs[QStringLiteral("c1")];
    c.events.clear();
    f.server.bumpEpoch(QStringLiteral("c1"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("new1"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("new2"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("new3"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("new4"));
    QSignalSpy reset(&f.client, &Client::conversationReset);
    const int before = f.requestsOf(QStringLiteral("sync"));
    f.client.sync(QStringLiteral("c1"));
    QTRY_COMPARE(reset.size(), 1);
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 4);
    const auto syncs = f.server.requests(QStringLiteral("sync")).mid(before);
    QCOMPARE(syncs.size(), 2);
    QCOMPARE(syncs[0].value(QStringLiteral("epoch")).toInteger(), 1);
    QCOMPARE(syncs[1].value(QStringLiteral("after")).toInteger(), 0);
    QVERIFY(!syncs[1].contains(QStringLiteral("epoch")));
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT epoch FROM conversations WHERE conv = 'c1'")).toLongLong(), 2);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'c1' AND body LIKE 'old%'")).toInt(), 0);
    QCOMPARE(f.eventCount(QStringLiteral("c1")), 4);
}

void TestClientSync::cursor_ahead_drops_the_cursor_and_rebuilds() {
    Fixture f;
    for (int i = 1; i <= 5; ++i)
        f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 5);
    // The server lost its tail (restored from a backup): head is now 3.
    f.server.convs[QStringLiteral("c1")].events.resize(3);
    const int before = f.requestsOf(QStringLiteral("sync"));
    f.client.sync(QStringLiteral("c1"));
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 3);
    const auto syncs = f.server.requests(QStringLiteral("sync")).mid(before);
    QCOMPARE(syncs.size(), 2);
    QCOMPARE(syncs[0].value(QStringLiteral("after")).toInteger(), 5);
    QCOMPARE(syncs[1].value(QStringLiteral("after")).toInteger(), 0);
}

void TestClientSync::out_of_order_event_push_is_not_applied_but_triggers_sync() {
    Fixture f;
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b1"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b2"));
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 2);
    QTRY_COMPARE(f.server.subscribedCount(), 1);
    f.server.pushEvents = false;
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b3"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b4"));
    f.server.holdReplies.insert(QStringLiteral("sync"), 1); // hold the pull back until released
    const int before = f.requestsOf(QStringLiteral("sync"));
    const QJsonObject ev4 = f.server.convs[QStringLiteral("c1")].events.at(3);
    f.server.pushToAll({{QStringLiteral("t"), QStringLiteral("event")}, {QStringLiteral("ev"), ev4}});
    QTRY_COMPARE(f.requestsOf(QStringLiteral("sync")), before + 1);
    // seq 4 was not applied on top of cursor 2.
    QCOMPARE(f.cursor(QStringLiteral("c1")), 2);
    QCOMPARE(f.eventCount(QStringLiteral("c1")), 2);
    QCOMPARE(f.server.requests(QStringLiteral("sync")).last().value(QStringLiteral("after")).toInteger(), 2);
    f.server.releaseHeld();
    QTRY_COMPARE_WITH_TIMEOUT(f.cursor(QStringLiteral("c1")), 4, 5000);
    QCOMPARE(f.eventCount(QStringLiteral("c1")), 4);
    // The next one in order is applied directly, without a sync, and acked.
    const int syncsNow = f.requestsOf(QStringLiteral("sync"));
    f.server.pushEvents = true;
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b5"));
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 5);
    QTRY_COMPARE(f.server.requests(QStringLiteral("ack")).last().value(QStringLiteral("seq")).toInteger(), 5);
    QCOMPARE(f.requestsOf(QStringLiteral("sync")), syncsNow);
}

void TestClientSync::resync_syncs_every_conversation() {
    Fixture f;
    f.server.convs[QStringLiteral("c2")].members = {QStringLiteral("ana"), QStringLiteral("cy")};
    QSignalSpy synced(&f.client, &im::Client::conversationSynced);
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.server.subscribedCount(), 1);
    QTRY_COMPARE(f.client.conversationIds().size(), 2);
    // Both session-start syncs answered: only the resync can fetch what
    // is appended next.
    const auto syncedBoth = [&] {
        QSet<QString> seen;
        for (const QList<QVariant> &args : synced)
            seen.insert(args.at(0).toString());
        return seen.contains(QStringLiteral("c1")) && seen.contains(QStringLiteral("c2"));
    };
    QTRY_VERIFY(syncedBoth());
    const int syncsBefore = f.requestsOf(QStringLiteral("sync"));
    f.server.pushEvents = false;
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("x"));
    f.server.append(QStringLiteral("c2"), QStringLiteral("cy"), QStringLiteral("y"));
    f.server.pushToAll({{QStringLiteral("t"), QStringLiteral("resync")}});
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 1);
    QTRY_COMPARE(f.cursor(QStringLiteral("c2")), 1);
    QVERIFY(f.requestsOf(QStringLiteral("sync")) >= syncsBefore + 2);
}

// Issue 26 item 2. The server lost more of its tail than backlogLimit (a
// restore) and took one new message: the client's cursor is ahead, it
// rebuilds from the newest window and stops there; what the server lost is
// gone locally too. Before: the reset kept the old head, so every window
// looked "far behind" again and history was asked for forever.
void TestClientSync::a_server_restored_with_a_loss_above_the_backlog_limit_converges_without_a_loop() {
    Fixture f;
    const QString c1 = QStringLiteral("c1");
    for (int i = 1; i <= 10; ++i)
        f.server.append(c1, QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(c1), 10);
    f.client.setBacklogLimit(3);
    f.client.setHistoryWindow(2);
    f.server.convs[c1].events.resize(4); // restored: seqs 5-10 lost, 6 > backlogLimit
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("after the restore")); // seq 5 again
    f.client.sync(c1);
    // Converged: it syncs forward from the window's head (the loop asked for
    // one window after another instead, and never synced).
    const auto syncedFrom = [&](qint64 after) {
        const auto syncs = f.server.requests(QStringLiteral("sync"));
        return std::any_of(syncs.cbegin(), syncs.cend(), [&](const QJsonObject &r) {
            return r.value(QStringLiteral("after")).toInteger() == after;
        });
    };
    QTRY_VERIFY_WITH_TIMEOUT(syncedFrom(5), 5000);
    QCOMPARE(f.cursor(c1), 5);
    QCOMPARE(f.server.historyRequests, 1);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT MAX(seq) FROM events WHERE conv = ?"), {c1}).toLongLong(), 5);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT body FROM events WHERE conv = ? AND seq = 5"), {c1}).toString(),
             QStringLiteral("after the restore"));
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT head FROM conversations WHERE conv = ?"), {c1}).toLongLong(), 5);
    // And it stays converged: the next message is the next seq.
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("b6 new"));
    QTRY_COMPARE(f.cursor(c1), 6);
    QCOMPARE(f.server.historyRequests, 1);
}

// Issue 26 item 2, the short loss: rebuilt by sync from 0 (no window); the
// events the server lost (4, 5) do not stay on screen as delivered.
void TestClientSync::a_server_restored_with_a_loss_below_the_backlog_limit_drops_the_lost_events() {
    Fixture f;
    const QString c1 = QStringLiteral("c1");
    for (int i = 1; i <= 5; ++i)
        f.server.append(c1, QStringLiteral("ben"), QStringLiteral("b%1").arg(i));
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(c1), 5);
    f.server.convs[c1].events.resize(3);
    f.client.sync(c1);
    QTRY_COMPARE(f.cursor(c1), 3);
    QTRY_COMPARE(f.eventCount(c1), 3);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT MAX(seq) FROM events WHERE conv = ?"), {c1}).toLongLong(), 3);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT head FROM conversations WHERE conv = ?"), {c1}).toLongLong(), 3);
    QCOMPARE(f.server.historyRequests, 0);
}

// Issue 26 item 6. Our message was seq 1; the server, restored, gave seq 1
// to ben. His message is his (not "mine", not our cmid's state), ours is
// still there as ours.
void TestClientSync::own_messages_are_matched_by_cmid_not_by_seq() {
    Fixture f;
    const QString c1 = QStringLiteral("c1");
    f.server.eventsCarryCmid = true;
    QVERIFY(f.openAndConnect());
    const QString cmid = f.client.send(c1, QStringLiteral("mine"));
    QTRY_COMPARE(f.client.messageState(cmid), MessageState::Sent);
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("b2"));
    QTRY_COMPARE(f.cursor(c1), 2);
    FakeServer::Conv &conv = f.server.convs[c1];
    conv.events.clear(); // restored from before both
    conv.keys.clear();
    conv.fingerprints.clear();
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("ben's, at seq 1"), QStringLiteral("ben-cmid-1"));
    f.client.sync(c1);
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT sender FROM events WHERE conv = ? AND seq = 1"), {c1}).toString(),
                 QStringLiteral("ben"));
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT cmid FROM events WHERE conv = ? AND seq = 1"), {c1}).toString(),
             QStringLiteral("ben-cmid-1"));
    const auto rows = im::ClientPrivate::get(&f.client)->storage.messages(c1, QStringLiteral("ana"));
    QVERIFY(rows);
    int bens = 0, ours = 0;
    for (const auto &r : *rows) {
        if (r.sender == u"ben") {
            ++bens;
            QVERIFY(!r.own);
            QVERIFY(r.cmid != cmid);
        } else if (r.cmid == cmid) {
            ++ours;
            QVERIFY(r.own);
        }
    }
    QCOMPARE(bens, 1);
    QCOMPARE(ours, 1);
    QCOMPARE(im::ClientPrivate::get(&f.client)->storage.cmidAt(c1, 1), QString());
}

void TestClientSync::a_draft_whose_own_event_is_stored_before_its_answer_is_shown_once() {
    // Found by fuzz_sdk_apply: our event came by sync while the draft was
    // still Pending (its answer lost, or its settle still batched when the
    // process died). The timeline shows the message once, as the stored
    // event, before and after a restart, and still once when settled.
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("store.db"));
    const QString c1 = QStringLiteral("c1"), cmid = QStringLiteral("cmid-1");
    im::detail::Storage st;
    QVERIFY(st.open(path));
    QVERIFY(st.setMeta(QStringLiteral("user"), QStringLiteral("ana")));
    im::detail::OutboxRow row;
    row.cmid = cmid;
    row.kind = QStringLiteral("send");
    row.conv = c1;
    row.body = QStringLiteral("hello");
    row.createdAt = 1000;
    QVERIFY(st.enqueue(row) > 0);
    im::proto::Page page;
    page.conv = c1;
    page.epoch = 1;
    page.head = 1;
    page.nextAfter = 1;
    page.events = {im::proto::Event{c1, 1, QStringLiteral("mid-1"), QStringLiteral("msg"), QStringLiteral("ana"),
                                    QStringLiteral("hello"), 1001, 1, 0, {}, cmid}};
    QVERIFY(st.applyPage(page));
    const auto shownOnce = [&] {
        const auto rows = st.messages(c1, QStringLiteral("ana"));
        QVERIFY(rows);
        QCOMPARE(rows->size(), 1);
        QCOMPARE(rows->first().cmid, cmid);
        QCOMPARE(rows->first().seq, 1);
    };
    shownOnce();
    st.close();
    QVERIFY(st.open(path));
    shownOnce();
    QCOMPARE(st.loadOutbox()->size(), 1); // still Pending: the resend is answered dup:true
    QVERIFY(st.settleOutbox({im::detail::Storage::Finish{cmid, int(MessageState::Sent), {}, 1, true, 1}}, {}));
    shownOnce();
}

void TestClientSync::an_older_window_of_a_void_epoch_is_not_stored() {
    // Found by fuzz_sdk_apply: an older window (fetchMore into a gap) is on
    // its way while the conversation is reset for a new epoch and synced
    // again; the window of the old epoch must not be stored under the new one.
    QTemporaryDir dir;
    const QString c1 = QStringLiteral("c1");
    im::detail::Storage st;
    QVERIFY(st.open(dir.filePath(QStringLiteral("store.db"))));
    QVERIFY(st.setMeta(QStringLiteral("user"), QStringLiteral("ana")));
    const auto event = [&](qint64 seq, qint64 epoch) {
        return im::proto::Event{c1, seq, QStringLiteral("mid-%1-%2").arg(epoch).arg(seq), QStringLiteral("msg"),
                                QStringLiteral("ben"), QStringLiteral("b"), 1000 + seq, epoch, 0, {}, {}};
    };
    im::proto::Page newest; // epoch 1, head 6: the window 5..6, a gap 1..4 below it
    newest.conv = c1;
    newest.history = true;
    newest.epoch = 1;
    newest.head = 6;
    newest.oldest = 5;
    newest.hasOlder = true;
    newest.events = {event(5, 1), event(6, 1)};
    QVERIFY(st.applyWindow(newest, 0, 1));
    QCOMPARE(*st.gaps(c1), (QList<im::detail::Gap>{{1, 4}}));
    QVERIFY(st.resetConversation(c1, true)); // EPOCH_CHANGED
    im::proto::Page page; // epoch 2: the server kept 2 events
    page.conv = c1;
    page.epoch = 2;
    page.head = 2;
    page.nextAfter = 2;
    page.events = {event(1, 2), event(2, 2)};
    QVERIFY(st.applyPage(page));
    im::proto::Page older = newest; // the answer to `history before=5` of epoch 1
    older.head = 6;
    older.oldest = 3;
    older.hasOlder = true;
    older.events = {event(3, 1), event(4, 1)};
    bool stale = false;
    QVERIFY(st.applyWindow(older, 5, 1, &stale));
    const auto events = st.events(c1);
    QVERIFY(events);
    for (const auto &e : *events)
        QCOMPARE(e.epoch, 2);
    QCOMPARE(events->size(), 2);
    QVERIFY(st.gaps(c1)->isEmpty());
    QVERIFY(stale);
    // A window of the cursor's epoch is stored as before.
    older.epoch = 2;
    older.events = {};
    older.hasOlder = false;
    QVERIFY(st.applyWindow(older, 1, 1, &stale));
    QVERIFY(!stale);
}


// Issue 48. The server is restored to a point after our first message and
// before the next two (and ben's one), while we are away. Nothing is pushed
// to the conversation: the walk of the next session sees its head below our
// cursor and rebuilds it; our two lost messages go back to the outbox with
// their cmids and are created once more (their keys were lost too), and the
// timeline shows each of our three messages once. A later reconnect sends
// nothing again.
void TestClientSync::a_convs_walk_notices_a_restored_server_and_resends_the_lost_own_messages_once() {
    Fixture f;
    const QString c1 = QStringLiteral("c1");
    f.server.eventsCarryCmid = true;
    QVERIFY(f.openAndConnect());
    im::MessageListModel model(&f.client, c1);
    QStringList cmids;
    for (const char *body : {"one", "two", "three"}) {
        cmids << f.client.send(c1, QString::fromLatin1(body));
        QTRY_COMPARE(f.client.messageState(cmids.last()), MessageState::Sent);
    }
    f.server.append(c1, QStringLiteral("ben"), QStringLiteral("ben's, lost too"));
    QTRY_COMPARE(f.cursor(c1), 4);
    im::testing::Faults(&f.client).setOffline(true);
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Disconnected);
    // Restored: only seq 1 (ours, "one") is left, with its key.
    FakeServer::Conv &conv = f.server.convs[c1];
    conv.events.resize(1);
    for (auto it = conv.keys.begin(); it != conv.keys.end();)
        it = it.value() > 1 ? conv.keys.erase(it) : std::next(it);
    for (auto it = conv.fingerprints.begin(); it != conv.fingerprints.end();)
        it = conv.keys.contains(it.key()) ? std::next(it) : conv.fingerprints.erase(it);
    f.server.pushEvents = false; // nothing is pushed: the walk alone must notice
    const int sendsBefore = f.requestsOf(QStringLiteral("send"));
    im::testing::Faults(&f.client).setOffline(false);
    // The rebuild, then the two lost ones again, with their own cmids.
    QTRY_COMPARE(f.client.messageState(cmids.at(2)), MessageState::Sent);
    QTRY_COMPARE(f.client.messageState(cmids.at(1)), MessageState::Sent);
    QTRY_COMPARE(f.server.convs[c1].head(), 3);
    const auto sent = f.server.requests(QStringLiteral("send"));
    QStringList resent;
    for (qsizetype i = sendsBefore; i < sent.size(); ++i)
        resent << sent.at(i).value(QStringLiteral("cmid")).toString();
    QCOMPARE(resent, (QStringList{cmids.at(1), cmids.at(2)}));
    for (int i = 0; i < 3; ++i)
        QCOMPARE(f.server.convs[c1].events.at(i).value(QStringLiteral("cmid")).toString(), cmids.at(i));
    QCOMPARE(f.outboxRows(), 0);
    // Shown once each; ben's lost one is gone.
    const auto bodies = [&] {
        QStringList out;
        for (int row = 0; row < model.count(); ++row)
            out << model.get(row, im::MessageListModel::BodyRole).toString();
        return out;
    };
    const QStringList expected{QStringLiteral("three"), QStringLiteral("two"), QStringLiteral("one")};
    QTRY_COMPARE(bodies(), expected);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT seq FROM local_messages WHERE cmid = ?"), {cmids.at(2)}).toLongLong(), 3);
    // Once: another session sends nothing again; its walk syncs the two
    // new events (nothing was pushed), still shown once each.
    im::testing::Faults(&f.client).setOffline(true);
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Disconnected);
    const int walks = f.requestsOf(QStringLiteral("convs"));
    im::testing::Faults(&f.client).setOffline(false);
    QTRY_VERIFY(f.requestsOf(QStringLiteral("convs")) > walks);
    QTRY_VERIFY(!im::ClientPrivate::get(&f.client)->sync.isWalkingConvs()
                && im::ClientPrivate::get(&f.client)->sync.activeSyncs() == 0);
    QCOMPARE(f.requestsOf(QStringLiteral("send")), sendsBefore + 2);
    QCOMPARE(f.server.convs[c1].head(), 3);
    QTRY_COMPARE(f.cursor(c1), 3);
    QCOMPARE(f.eventCount(c1), 3);
    QTRY_COMPARE(bodies(), expected);
}

QTEST_GUILESS_MAIN(TestClientSync)
#include "tst_client_sync.moc"

void TestClientSync::a_sent_file_keeps_its_attachment_until_its_event_is_stored() {
    // Found by tst_qml under load: between the answer (Sent, a seq) and the
    // page that brings the event, our file's message showed no attachment.
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("store.db"));
    const QString c1 = QStringLiteral("c1"), cmid = QStringLiteral("cmid-f");
    im::detail::Storage st;
    QVERIFY(st.open(path));
    QVERIFY(st.setMeta(QStringLiteral("user"), QStringLiteral("ana")));
    im::detail::OutboxRow row;
    row.cmid = cmid;
    row.kind = QStringLiteral("send");
    row.conv = c1;
    row.body = QStringLiteral("a file");
    row.createdAt = 1000;
    const QString sha(64, QLatin1Char('a'));
    row.file = im::detail::OutboxFile{QStringLiteral("f.bin"), QStringLiteral("application/octet-stream"), sha, 10,
                                      QStringLiteral("att-1"), true};
    QVERIFY(st.enqueue(row) > 0);
    const auto shown = [&](const char *when) {
        const auto rows = st.messages(c1, QStringLiteral("ana"));
        QVERIFY(rows);
        QCOMPARE(rows->size(), 1);
        QVERIFY2(rows->first().attachments.size() == 1, when);
        QCOMPARE(rows->first().attachments.first().id, QStringLiteral("att-1"));
        QCOMPARE(rows->first().attachments.first().name, QStringLiteral("f.bin"));
    };
    shown("pending");
    QVERIFY(st.settleOutbox({im::detail::Storage::Finish{cmid, int(MessageState::Sent), {}, 1, false, 1}}, {}));
    shown("sent, its event not stored yet");
    im::proto::Page page;
    page.conv = c1;
    page.epoch = 1;
    page.head = 1;
    page.nextAfter = 1;
    im::proto::Event e{c1, 1, QStringLiteral("mid-1"), QStringLiteral("msg"), QStringLiteral("ana"),
                       QStringLiteral("a file"), 1001, 1, 0, {}, cmid};
    e.attachments = {im::proto::Attachment{QStringLiteral("att-1"), QStringLiteral("f.bin"),
                                           QStringLiteral("application/octet-stream"), 10, sha}};
    page.events = {e};
    QVERIFY(st.applyPage(page));
    shown("its event stored");
    // The outbox's row is gone with the page that stored the event.
    {
        QSqlDatabase check = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("sentfile-check"));
        check.setDatabaseName(path);
        QVERIFY(check.open());
        QSqlQuery q(check);
        QVERIFY(q.exec(QStringLiteral("SELECT count(*) FROM outbox_files")) && q.next());
        QCOMPARE(q.value(0).toInt(), 0);
    }
    QSqlDatabase::removeDatabase(QStringLiteral("sentfile-check"));
}
