// im::Client against an in-process fake server: one test per obligation of
// docs/sdk.md / spec sdk.md. Each test is written so that breaking the
// obligation it names makes it fail.
#include "client_p.h"
#include "fakeserver.h"
#include "sdktestutil.h"

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

using im::Client;
using im::ConnectionState;
using im::MessageState;

namespace {

struct Fixture {
    QTemporaryDir dir;
    FakeServer server;
    Client client;
    QString db;

    Fixture() {
        server.listen();
        server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
        client.setServers({server.url()});
        client.setCredentials(QStringLiteral("tok-ana"));
        client.setRequestTimeout(400);
        client.setRetryBackoff(40, 300);
        client.setReconnectBackoff(40, 200);
        db = dir.filePath(QStringLiteral("client.db"));
    }
    bool openAndConnect() {
        if (!client.open(db))
            return false;
        client.connectToServer();
        return QTest::qWaitFor([this] { return client.connectionState() == ConnectionState::Connected; }, 5000);
    }
    qint64 cursor(const QString &conv) {
        return sqlScalar(db, QStringLiteral("SELECT after FROM conversations WHERE conv = ?"), {conv}).toLongLong();
    }
    qint64 eventCount(const QString &conv) {
        return sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = ?"), {conv}).toLongLong();
    }
    qint64 outboxRows() { return sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox")).toLongLong(); }
    qint64 state(const QString &cmid) {
        return sqlScalar(db, QStringLiteral("SELECT state FROM local_messages WHERE cmid = ?"), {cmid}).toLongLong();
    }
    int requestsOf(const QString &t) { return int(server.requests(t).size()); }
};

} // namespace

class TestClient : public QObject {
    Q_OBJECT
private slots:
    void send_commits_the_outbox_row_before_the_first_frame_leaves();
    void send_success_removes_the_outbox_entry_and_records_seq();
    void own_event_with_our_cmid_settles_a_send_whose_reply_was_lost();
    void terminal_errors_remove_the_entry_with_their_final_state_data();
    void terminal_errors_remove_the_entry_with_their_final_state();
    void retryable_outcomes_keep_the_entry_and_resend_the_same_cmid_data();
    void retryable_outcomes_keep_the_entry_and_resend_the_same_cmid();
    void resend_after_reconnect_is_in_creation_order_with_the_same_cmids();
    void a_backlog_in_one_conversation_leaves_room_for_the_others();
    void unanswered_requests_are_retried_with_capped_exponential_backoff();
    void interrupted_page_apply_keeps_the_old_cursor_and_no_events();
    void a_page_cut_at_any_statement_leaves_all_of_it_or_none();
    void sync_loops_while_has_more_and_acks_the_highest_applied_seq();
    void trimmed_page_records_a_permanent_gap();
    void epoch_changed_drops_local_events_and_rebuilds_from_zero();
    void cursor_ahead_drops_the_cursor_and_rebuilds();
    void out_of_order_event_push_is_not_applied_but_triggers_sync();
    void hint_triggers_sync_and_updates_the_read_marker();
    void resync_syncs_every_conversation();
    void goaway_reconnects_to_the_next_server_url();
    void reconnect_rotates_through_urls_with_backoff();
    void stale_install_on_hello_is_reported_and_stops_the_client();
    void stale_install_on_ack_is_reported();
    void a_send_answered_unauthenticated_stays_pending_and_goes_once_accepted_again();
    void install_id_is_generated_once_and_sent_in_hello();
    void recall_goes_through_the_outbox_and_the_target_shows_recalled();
    void mark_read_sends_read_and_records_the_marker();
    void message_model_shows_pending_at_once_then_sent_and_others_messages();
    void conversation_model_exposes_markers();
    void failed_outbox_write_is_surfaced_and_nothing_is_sent();
    void database_is_wal_synchronous_full_with_a_schema_version();
    void newer_schema_version_is_refused();
    void recalled_lookup_is_an_index_search();
    void outbox_introspection_reports_attempts_last_error_and_depth();
    void outbox_model_follows_one_send_row_by_row_on_a_long_backlog();
    void qa_hooks_go_offline_drop_a_reply_and_close_the_socket();
    void socket_has_no_nagle_delay();
    void failed_message_stays_where_it_was_sent();
    // Issue 26, items 2, 5, 6, 13.
    void a_server_restored_with_a_loss_above_the_backlog_limit_converges_without_a_loop();
    void a_server_restored_with_a_loss_below_the_backlog_limit_drops_the_lost_events();
    void an_outbox_write_never_runs_under_a_synchronous_left_relaxed();
    void unread_badge_is_the_servers_count_also_across_a_gap();
    void own_messages_are_matched_by_cmid_not_by_seq();
    void a_draft_whose_own_event_is_stored_before_its_answer_is_shown_once();
    void an_older_window_of_a_void_epoch_is_not_stored();
    void a_batched_retry_never_takes_back_the_attempts_on_the_wire();
    void a_draft_written_under_another_users_token_is_never_sent();
    void a_draft_names_the_credential_it_was_written_under();
    // Second audit against sdk.md (2026-12-03).
    void resend_after_reconnect_is_in_creation_order_across_conversations();
    void the_on_the_wire_mark_is_written_with_a_flush();
};

void TestClient::send_commits_the_outbox_row_before_the_first_frame_leaves() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    int checked = 0;
    bool rowPresent = false;
    f.server.onFrame = [&](const QJsonObject &req) {
        if (req.value(QStringLiteral("t")).toString() != u"send")
            return;
        ++checked;
        // What another process (a restarted client) would find in the file
        // at the moment the server holds the frame.
        rowPresent = sqlScalar(f.db, QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid = ? AND body = ?"),
                               {req.value(QStringLiteral("cmid")).toString(),
                                req.value(QStringLiteral("body")).toString()})
                         .toInt() == 1;
    };
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("hello"));
    QVERIFY(!QUuid::fromString(cmid).isNull());
    QCOMPARE(QUuid::fromString(cmid).version(), QUuid::Random);
    // Committed before send() returned.
    QCOMPARE(f.outboxRows(), 1);
    QTRY_COMPARE(checked, 1);
    QVERIFY(rowPresent);
}

void TestClient::send_success_removes_the_outbox_entry_and_records_seq() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    QSignalSpy states(&f.client, &Client::messageStateChanged);
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("hello"));
    QTRY_COMPARE(f.client.messageState(cmid), MessageState::Sent);
    QCOMPARE(f.outboxRows(), 0);
    QCOMPARE(f.client.pendingCount(), 0);
    QCOMPARE(states.size(), 2);
    QCOMPARE(states.at(0).at(3).value<MessageState>(), MessageState::Pending);
    QCOMPARE(states.at(1).at(1).toString(), cmid);
    QCOMPARE(states.at(1).at(2).toLongLong(), 1);
    QCOMPARE(states.at(1).at(3).value<MessageState>(), MessageState::Sent);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT seq FROM local_messages WHERE cmid = ?"), {cmid}).toLongLong(), 1);
}

void TestClient::own_event_with_our_cmid_settles_a_send_whose_reply_was_lost() {
    Fixture f;
    f.server.eventsCarryCmid = true;
    f.server.dropReplies.insert(QStringLiteral("send"), 1);
    f.client.setRequestTimeout(60000); // a resend would come far too late to matter
    QVERIFY(f.openAndConnect());
    QTRY_VERIFY(f.server.subscribedCount() == 1);
    im::MessageListModel model(&f.client, QStringLiteral("c1"));
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("reply lost"));
    // The pushed event carries our cmid: the message is Sent at once, the
    // outbox is empty, and the timeline holds one row for it, not two.
    QTRY_COMPARE_WITH_TIMEOUT(f.client.messageState(cmid), MessageState::Sent, 5000);
    QCOMPARE(f.outboxRows(), 0);
    QCOMPARE(f.client.pendingCount(), 0);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT seq FROM local_messages WHERE cmid = ?"), {cmid}).toLongLong(), 1);
    const auto rowsFor = [&model](const QString &body) {
        int rows = 0;
        for (int i = 0; i < model.rowCount(); ++i)
            if (model.data(model.index(i), im::MessageListModel::BodyRole).toString() == body)
                ++rows;
        return rows;
    };
    QTRY_COMPARE(rowsFor(QStringLiteral("reply lost")), 1);
    // Barrier: a second message of the same conversation. Entries of one
    // conversation leave in creation order, each after the one before has its
    // verdict (obligation 9), so a resend of the first would be on the wire
    // before this one; and its event, applied after the first's, shows in the
    // model only after any second row of the first would have.
    const QString next = f.client.send(QStringLiteral("c1"), QStringLiteral("barrier"));
    QTRY_COMPARE_WITH_TIMEOUT(f.client.messageState(next), MessageState::Sent, 5000);
    QTRY_COMPARE(rowsFor(QStringLiteral("barrier")), 1);
    QCOMPARE(rowsFor(QStringLiteral("reply lost")), 1);
    QCOMPARE(f.server.distinctCmids(), (QStringList{cmid, next}));
    QCOMPARE(f.requestsOf(QStringLiteral("send")), 2); // settled without a resend
}

void TestClient::terminal_errors_remove_the_entry_with_their_final_state_data() {
    QTest::addColumn<QString>("code");
    QTest::addColumn<int>("state");
    QTest::newRow("NOT_MEMBER") << "NOT_MEMBER" << int(MessageState::Failed);
    QTest::newRow("IDEMPOTENCY_MISMATCH") << "IDEMPOTENCY_MISMATCH" << int(MessageState::Failed);
    QTest::newRow("INVALID_ARGUMENT") << "INVALID_ARGUMENT" << int(MessageState::Failed);
    QTest::newRow("ORIGINAL_EXPIRED") << "ORIGINAL_EXPIRED" << int(MessageState::Expired);
}

void TestClient::terminal_errors_remove_the_entry_with_their_final_state() {
    QFETCH(QString, code);
    QFETCH(int, state);
    Fixture f;
    QVERIFY(f.openAndConnect());
    f.server.failWith.insert(QStringLiteral("send"), code);
    QSignalSpy states(&f.client, &Client::messageStateChanged);
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("doomed"));
    QTRY_COMPARE(states.size(), 2);
    QCOMPARE(states.at(1).at(3).value<MessageState>(), MessageState(state));
    QCOMPARE(states.at(1).at(4).toString(), code);
    QCOMPARE(f.outboxRows(), 0);
    QCOMPARE(f.state(cmid), state);
    // Never resent: not on the next retry tick, not after a reconnect.
    f.server.failWith.clear();
    const int hellos = f.requestsOf(QStringLiteral("hello"));
    im::testing::Faults(&f.client).closeSocketNow();
    QTRY_VERIFY(f.requestsOf(QStringLiteral("hello")) > hellos);
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Connected);
    // Barrier: a second message of the same conversation, sent once the new
    // session is up. An entry still in the outbox (due after the reconnect or
    // waiting for a retry) is its conversation's head and would go on the
    // wire, and get its answer, before this one leaves (obligation 9).
    const QString probe = f.client.send(QStringLiteral("c1"), QStringLiteral("probe"));
    QTRY_COMPARE_WITH_TIMEOUT(f.client.messageState(probe), MessageState::Sent, 5000);
    QStringList wire;
    for (const QJsonObject &o : f.server.requests(QStringLiteral("send")))
        wire << o.value(QStringLiteral("cmid")).toString();
    QCOMPARE(wire, (QStringList{cmid, probe}));
    QCOMPARE(f.client.messageState(cmid), MessageState(state));
}

void TestClient::retryable_outcomes_keep_the_entry_and_resend_the_same_cmid_data() {
    QTest::addColumn<QString>("fault");
    QTest::newRow("UNAVAILABLE twice") << "unavailable";
    QTest::newRow("reply dropped (timeout)") << "drop";
    QTest::newRow("socket closed mid-request") << "close";
}

void TestClient::retryable_outcomes_keep_the_entry_and_resend_the_same_cmid() {
    QFETCH(QString, fault);
    Fixture f;
    QVERIFY(f.openAndConnect());
    const QString send = QStringLiteral("send");
    if (fault == u"unavailable")
        f.server.unavailable.insert(send, 2);
    else if (fault == u"drop")
        f.server.dropReplies.insert(send, 1);
    else
        f.server.closeOn.insert(send, 1);
    // While it retries the message stays Pending, in the store and in what
    // the app is told: a retryable outcome is never shown as Failed (the
    // dropped and the cut-off send were committed; the others may read it).
    bool rowKeptOnRetry = true;
    QString cmid;
    f.server.onFrame = [&](const QJsonObject &req) {
        if (req.value(QStringLiteral("t")).toString() == send && f.requestsOf(send) > 1)
            rowKeptOnRetry = rowKeptOnRetry && f.outboxRows() == 1 && f.state(cmid) == int(MessageState::Pending);
    };
    QSignalSpy states(&f.client, &Client::messageStateChanged);
    cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("persist"));
    QTRY_COMPARE_WITH_TIMEOUT(f.client.messageState(cmid), MessageState::Sent, 10000);
    QVERIFY(f.requestsOf(send) >= 2);
    QVERIFY(rowKeptOnRetry);
    QVERIFY(!states.isEmpty());
    for (const QList<QVariant> &s : states) {
        const auto shown = s.at(3).value<MessageState>();
        QVERIFY2(shown == MessageState::Pending || shown == MessageState::Sent,
                 qPrintable(QStringLiteral("state %1 shown on the way").arg(int(shown))));
    }
    QCOMPARE(states.last().at(3).value<MessageState>(), MessageState::Sent);
    QCOMPARE(f.server.distinctCmids(), QStringList{cmid});
    QCOMPARE(f.server.convs[QStringLiteral("c1")].head(), 1); // exactly one event
    QCOMPARE(f.outboxRows(), 0);
}

void TestClient::resend_after_reconnect_is_in_creation_order_with_the_same_cmids() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    // Queued while disconnected.
    QStringList cmids;
    for (int i = 0; i < 5; ++i)
        cmids << f.client.send(QStringLiteral("c1"), QStringLiteral("m%1").arg(i));
    f.client.setRequestTimeout(10000);
    f.server.dropReplies.insert(QStringLiteral("send"), 1); // the head's answer is lost
    f.client.connectToServer();
    QTRY_VERIFY(f.requestsOf(QStringLiteral("send")) >= 1);
    // Connection lost with the head unanswered: resent after the next hello.
    im::testing::Faults(&f.client).closeSocketNow();
    QTRY_COMPARE_WITH_TIMEOUT(f.client.pendingCount(), 0, 10000);
    // Stored once each, in creation order (seq order = creation order).
    const FakeServer::Conv &c1 = f.server.convs[QStringLiteral("c1")];
    QStringList stored(c1.head());
    for (auto k = c1.keys.cbegin(); k != c1.keys.cend(); ++k)
        stored[k.value() - 1] = k.key().section(QLatin1Char('\n'), 1);
    QCOMPARE(stored, cmids);
    QCOMPARE(f.server.convs[QStringLiteral("c1")].head(), 5);
    // Every attempt used one of the original cmids; each connection put its
    // sends on the wire in creation order (pipelined, obligation 9), each
    // send after the first naming the one before it as `prev`; and the head,
    // whose answer was lost, went again after the second hello.
    QList<QStringList> perConnection;
    for (const QJsonObject &o : std::as_const(f.server.received)) {
        const QString t = o.value(QStringLiteral("t")).toString();
        if (t == u"hello")
            perConnection.append(QStringList());
        else if (t == u"send") {
            QVERIFY(!perConnection.isEmpty());
            perConnection.last() << o.value(QStringLiteral("cmid")).toString();
            const QString prev = o.value(QStringLiteral("prev")).toString();
            if (!prev.isEmpty())
                QVERIFY2(cmids.indexOf(prev) == cmids.indexOf(perConnection.last().last()) - 1,
                         "prev names the message just before");
        }
    }
    QCOMPARE(perConnection.size(), 2);
    for (const QStringList &wire : std::as_const(perConnection)) {
        qsizetype last = -1;
        for (const QString &cmid : wire) {
            QVERIFY2(cmids.indexOf(cmid) > last, "sends of one connection in creation order");
            last = cmids.indexOf(cmid);
        }
    }
    QCOMPARE(perConnection.at(0), cmids); // all five pipelined at once
    QVERIFY(!perConnection.at(1).isEmpty());
    QCOMPARE(perConnection.at(1).first(), cmids.first());
}

// Pipelining shares the window: one conversation's backlog takes at most
// half of it, so a message of another conversation goes on the wire in the
// same pass, not after thousands.
void TestClient::a_backlog_in_one_conversation_leaves_room_for_the_others() {
    Fixture f;
    f.server.convs[QStringLiteral("c2")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    f.client.setRequestTimeout(60000); // the held replies must not time out
    QVERIFY(f.client.open(f.db));
    for (int i = 0; i < 300; ++i)
        QVERIFY(!f.client.send(QStringLiteral("c1"), QStringLiteral("backlog %1").arg(i)).isEmpty());
    const QString other = f.client.send(QStringLiteral("c2"), QStringLiteral("elsewhere"));
    const int window = im::ClientPrivate::get(&f.client)->outbox.window;
    QVERIFY(window >= 4);
    f.server.holdReplies.insert(QStringLiteral("send"), 1000000);
    f.client.connectToServer();
    QTRY_VERIFY(f.requestsOf(QStringLiteral("send")) >= window / 2 + 1);
    QHash<QString, int> perConv;
    for (const QJsonObject &o : f.server.requests(QStringLiteral("send")))
        ++perConv[o.value(QStringLiteral("conv")).toString()];
    QCOMPARE(perConv.value(QStringLiteral("c2")), 1);
    QCOMPARE(perConv.value(QStringLiteral("c1")), window / 2);
    // The outbox shows what each entry on the wire waits behind (its `prev`),
    // the same on the entries and in the model, and as it went on the wire.
    QHash<QString, QString> wirePrev;
    for (const QJsonObject &o : f.server.requests(QStringLiteral("send")))
        wirePrev.insert(o.value(QStringLiteral("cmid")).toString(), o.value(QStringLiteral("prev")).toString());
    im::OutboxModel model(&f.client);
    const QList<im::OutboxEntry> entries = f.client.outbox();
    QCOMPARE(model.rowCount(), entries.size());
    QString before;
    int onWire = 0;
    for (qsizetype i = 0; i < entries.size(); ++i) {
        const im::OutboxEntry &e = entries.at(i);
        QCOMPARE(model.get(int(i), im::OutboxModel::PrevRole).toString(), e.prev);
        if (!e.inFlight) {
            QVERIFY2(e.prev.isEmpty(), qPrintable(e.cmid));
            continue;
        }
        ++onWire;
        QCOMPARE(e.prev, wirePrev.value(e.cmid));
        if (e.conv == u"c2")
            QVERIFY(e.prev.isEmpty()); // nothing of c2 was unanswered
        else
            QCOMPARE(e.prev, before); // the c1 entry just before it (empty for the first)
        if (e.conv == u"c1")
            before = e.cmid;
    }
    QCOMPARE(onWire, window / 2 + 1);
    f.server.holdReplies.clear();
    f.server.releaseHeld();
    QTRY_COMPARE_WITH_TIMEOUT(f.client.pendingCount(), 0, 30000);
    QCOMPARE(f.client.messageState(other), MessageState::Sent);
    QCOMPARE(f.server.convs[QStringLiteral("c1")].head(), 300);
}

void TestClient::unanswered_requests_are_retried_with_capped_exponential_backoff() {
    Fixture f;
    const int timeout = 100, initial = 100, cap = 400;
    f.client.setRequestTimeout(timeout);
    f.client.setRetryBackoff(initial, cap);
    QVERIFY(f.openAndConnect());
    // 8 lost replies: the last five retries come at the cap, where an
    // uncapped backoff would be far outside the margin below.
    f.server.dropReplies.insert(QStringLiteral("send"), 8);
    QList<qint64> at;
    QElapsedTimer clock;
    clock.start();
    f.server.onFrame = [&](const QJsonObject &req) {
        if (req.value(QStringLiteral("t")).toString() == u"send")
            at << clock.elapsed();
    };
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("retry me"));
    QTRY_COMPARE_WITH_TIMEOUT(f.client.messageState(cmid), MessageState::Sent, 15000);
    QCOMPARE(at.size(), 9);
    for (int i = 1; i < at.size(); ++i) {
        const qint64 d = std::min<qint64>(cap, qint64(initial) << (i - 1));
        const qint64 gap = at[i] - at[i - 1];
        // timeout + jittered backoff in [d/2, d]. Never earlier is the
        // property (exact, less 10 ms of timer rounding); later is only
        // scheduling (the 50 ms tick, an event loop or a machine under load:
        // this runs at -j2 beside the lab and under ASan), so the upper
        // margin is 1 s: an uncapped backoff (jittered 1.6-3.2 s, 3.2-6.4 s,
        // 6.4-12.8 s in the last three retries) is still far outside it.
        QVERIFY2(gap >= timeout + d / 2 - 10 && gap <= timeout + d + 1000,
                 qPrintable(QStringLiteral("retry %1 after %2 ms, expected %3..%4").arg(i).arg(gap)
                                .arg(timeout + d / 2).arg(timeout + d)));
    }
    QCOMPARE(f.server.distinctCmids(), QStringList{cmid});
}

void TestClient::interrupted_page_apply_keeps_the_old_cursor_and_no_events() {
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
void TestClient::a_page_cut_at_any_statement_leaves_all_of_it_or_none() {
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

void TestClient::sync_loops_while_has_more_and_acks_the_highest_applied_seq() {
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

void TestClient::trimmed_page_records_a_permanent_gap() {
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

void TestClient::epoch_changed_drops_local_events_and_rebuilds_from_zero() {
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

void TestClient::cursor_ahead_drops_the_cursor_and_rebuilds() {
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

void TestClient::out_of_order_event_push_is_not_applied_but_triggers_sync() {
    Fixture f;
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b1"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b2"));
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 2);
    QTRY_COMPARE(f.server.subscribedCount(), 1);
    f.server.pushEvents = false;
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b3"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b4"));
    f.server.dropReplies.insert(QStringLiteral("sync"), 1); // hold the pull back for a moment
    const int before = f.requestsOf(QStringLiteral("sync"));
    const QJsonObject ev4 = f.server.convs[QStringLiteral("c1")].events.at(3);
    f.server.pushToAll({{QStringLiteral("t"), QStringLiteral("event")}, {QStringLiteral("ev"), ev4}});
    QTRY_COMPARE(f.requestsOf(QStringLiteral("sync")), before + 1);
    // seq 4 was not applied on top of cursor 2.
    QCOMPARE(f.cursor(QStringLiteral("c1")), 2);
    QCOMPARE(f.eventCount(QStringLiteral("c1")), 2);
    QCOMPARE(f.server.requests(QStringLiteral("sync")).last().value(QStringLiteral("after")).toInteger(), 2);
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

void TestClient::hint_triggers_sync_and_updates_the_read_marker() {
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

void TestClient::resync_syncs_every_conversation() {
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

void TestClient::goaway_reconnects_to_the_next_server_url() {
    Fixture f;
    FakeServer second;
    QVERIFY(second.listen());
    second.convs = f.server.convs;
    f.client.setServers({f.server.url(), second.url()});
    QVERIFY(f.openAndConnect());
    QCOMPARE(f.client.currentServer(), f.server.url());
    QTRY_COMPARE(f.server.subscribedCount(), 1);
    f.server.pushToAll({{QStringLiteral("t"), QStringLiteral("goaway")}, {QStringLiteral("reason"), QStringLiteral("shutdown")}});
    QTRY_COMPARE(second.connections, 1);
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Connected);
    QCOMPARE(f.client.currentServer(), second.url());
    QCOMPARE(f.server.connections, 1);
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("via second"));
    QTRY_COMPARE(f.client.messageState(cmid), MessageState::Sent);
    QCOMPARE(second.distinctCmids(), QStringList{cmid});
}

void TestClient::reconnect_rotates_through_urls_with_backoff() {
    Fixture f;
    // A port nobody listens on.
    QTcpServer probe;
    QVERIFY(probe.listen(QHostAddress::LocalHost, 0));
    const QUrl dead(QStringLiteral("ws://127.0.0.1:%1/v1/ws").arg(probe.serverPort()));
    probe.close();
    f.client.setServers({dead, f.server.url()});
    f.client.setReconnectBackoff(200, 400);
    QVERIFY(f.client.open(f.db));
    QSignalSpy states(&f.client, &Client::connectionStateChanged);
    QDateTime nextAttempt;
    connect(&f.client, &Client::connectionStateChanged, &f.client, [&](ConnectionState s) {
        if (s == ConnectionState::Reconnecting && !nextAttempt.isValid())
            nextAttempt = f.client.nextReconnectAt();
    });
    QElapsedTimer clock;
    clock.start();
    f.client.connectToServer();
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Connected);
    QVERIFY(clock.elapsed() >= 100); // waited at least the jittered first backoff
    QVERIFY(nextAttempt.isValid());
    QCOMPARE(states.first().at(0).value<ConnectionState>(), ConnectionState::Connecting);
    bool sawReconnecting = false;
    for (const auto &s : states)
        sawReconnecting = sawReconnecting || s.at(0).value<ConnectionState>() == ConnectionState::Reconnecting;
    QVERIFY(sawReconnecting);
    QCOMPARE(f.client.currentServer(), f.server.url());
}

void TestClient::stale_install_on_hello_is_reported_and_stops_the_client() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    const QString draft = f.client.send(QStringLiteral("c1"), QStringLiteral("kept"));
    f.server.staleInstalls.insert(f.client.installId());
    QSignalSpy stale(&f.client, &Client::installStaleChanged);
    QSignalSpy errors(&f.client, &Client::errorOccurred);
    f.client.connectToServer();
    QTRY_COMPARE(stale.size(), 1);
    QVERIFY(f.client.isInstallStale());
    QCOMPARE(errors.last().at(0).toString(), QStringLiteral("STALE_INSTALL"));
    QCOMPARE(f.client.connectionState(), ConnectionState::Disconnected);
    // No reconnect loop on a stale install: the transport is stopped, with no
    // attempt scheduled. Every reconnect (after a loss, after a backoff) is
    // an attempt of a running transport, and only connectToServer() (refused
    // while stale) or coming back online (likewise) starts it again. The
    // public state alone would not show it: a transport that goes on waiting
    // for its next attempt still reads Disconnected here.
    const im::detail::Transport *transport = im::ClientPrivate::get(&f.client)->conn.transport();
    QVERIFY(!transport->isRunning());
    QCOMPARE(transport->state(), im::detail::Transport::State::Idle);
    QVERIFY(!transport->nextAttemptAt().isValid());
    QCOMPARE(f.server.connections, 1);
    QCOMPARE(f.client.pendingCount(), 1);
    // Remembered across restarts (one Client at a time has the store open).
    f.client.close();
    {
        Client again;
        QVERIFY(again.open(f.dir.filePath(QStringLiteral("client.db"))));
        QVERIFY(again.isInstallStale());
    }
    QVERIFY(f.client.open(f.db));
    // The app decides to reset: new install id, outbox kept and delivered.
    const QString oldId = f.client.installId();
    QVERIFY(f.client.resetInstall());
    QVERIFY(f.client.installId() != oldId);
    QVERIFY(!f.client.isInstallStale());
    f.client.connectToServer();
    QTRY_COMPARE(f.client.messageState(draft), MessageState::Sent);
}

void TestClient::stale_install_on_ack_is_reported() {
    Fixture f;
    f.server.failWith.insert(QStringLiteral("ack"), QStringLiteral("STALE_INSTALL"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b1"));
    QSignalSpy stale(&f.client, &Client::installStaleChanged);
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(stale.size(), 1);
    QCOMPARE(f.client.connectionState(), ConnectionState::Disconnected);
}

// A device revoked while its send was on the way: the server answers
// UNAUTHENTICATED and writes nothing. That is no verdict on the message: it
// stays Pending (never Failed) and goes once the server accepts the client
// again (here: the fake server stops refusing; in real life a new token).
void TestClient::a_send_answered_unauthenticated_stays_pending_and_goes_once_accepted_again() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    f.server.failWith.insert(QStringLiteral("send"), QStringLiteral("UNAUTHENTICATED"));
    QSignalSpy states(&f.client, &Client::messageStateChanged);
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("kept"));
    auto lastError = [&] {
        const auto entries = f.client.outbox();
        return entries.isEmpty() ? QString() : entries.first().lastError;
    };
    QTRY_COMPARE(lastError(), QStringLiteral("UNAUTHENTICATED"));
    QCOMPARE(f.client.messageState(cmid), MessageState::Pending);
    QCOMPARE(f.client.pendingCount(), 1);
    QCOMPARE(f.outboxRows(), 1);
    for (const auto &s : states)
        QVERIFY(s.at(3).value<MessageState>() != MessageState::Failed);
    f.server.failWith.clear();
    QTRY_COMPARE(f.client.messageState(cmid), MessageState::Sent);
    QCOMPARE(f.outboxRows(), 0);
}

void TestClient::install_id_is_generated_once_and_sent_in_hello() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    const QString id = f.client.installId();
    QCOMPARE(QUuid::fromString(id).version(), QUuid::Random);
    QCOMPARE(f.server.requests(QStringLiteral("hello")).first().value(QStringLiteral("install")).toString(), id);
    f.client.close();
    Client second;
    QVERIFY(second.open(f.db));
    QCOMPARE(second.installId(), id);
    QTemporaryDir other;
    Client third;
    QVERIFY(third.open(other.filePath(QStringLiteral("x.db"))));
    QVERIFY(third.installId() != id);
}

void TestClient::recall_goes_through_the_outbox_and_the_target_shows_recalled() {
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

void TestClient::mark_read_sends_read_and_records_the_marker() {
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

void TestClient::message_model_shows_pending_at_once_then_sent_and_others_messages() {
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

void TestClient::conversation_model_exposes_markers() {
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

void TestClient::failed_outbox_write_is_surfaced_and_nothing_is_sent() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    QSignalSpy errors(&f.client, &Client::errorOccurred);
    im::ClientPrivate::get(&f.client)->storage.injectFaultAfter(2); // the first INSERT
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("lost?"));
    QVERIFY(cmid.isEmpty());
    QCOMPARE(errors.size(), 1);
    QCOMPARE(errors.at(0).at(0).toString(), QStringLiteral("STORAGE_ERROR"));
    QVERIFY(!f.client.lastError().isEmpty());
    QCOMPARE(f.outboxRows(), 0);
    QCOMPARE(f.client.pendingCount(), 0);
    // The database is usable afterwards (the transaction was rolled back).
    const QString ok = f.client.send(QStringLiteral("c1"), QStringLiteral("fine"));
    QTRY_COMPARE(f.client.messageState(ok), MessageState::Sent);
    // Barrier: "fine" left after the refused send() returned, on the same
    // socket, and its answer is in; a frame of the refused one would have
    // reached the server first. The only send on the wire is "fine".
    const QList<QJsonObject> sends = f.server.requests(QStringLiteral("send"));
    QCOMPARE(sends.size(), 1);
    QCOMPARE(sends.first().value(QStringLiteral("cmid")).toString(), ok);
}

void TestClient::database_is_wal_synchronous_full_with_a_schema_version() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    auto &storage = im::ClientPrivate::get(&f.client)->storage;
    QCOMPARE(storage.pragma(QStringLiteral("journal_mode")), QStringLiteral("wal"));
    QCOMPARE(storage.pragma(QStringLiteral("synchronous")), QStringLiteral("2")); // FULL
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT MAX(version) FROM schema_version")).toInt(),
             im::detail::Storage::SchemaVersion);
    f.client.close();
    QVERIFY(f.client.open(f.db)); // reopening an up-to-date database migrates nothing
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT COUNT(*) FROM schema_version")).toInt(),
             im::detail::Storage::SchemaVersion);
}

// "Is seq recalled?" (every model row, every unread recount) must be an index
// search, not a scan of the conversation: a scan made a full sync cubic.
void TestClient::recalled_lookup_is_an_index_search() {
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

void TestClient::newer_schema_version_is_refused() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    f.client.close();
    sqlScalar(f.db, QStringLiteral("INSERT INTO schema_version(version, applied_at) VALUES(99, 0) RETURNING version"));
    QVERIFY(!f.client.open(f.db));
    QVERIFY(f.client.lastError().contains(QStringLiteral("newer")));
}

void TestClient::outbox_introspection_reports_attempts_last_error_and_depth() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    im::OutboxModel model(&f.client);
    f.client.send(QStringLiteral("c1"), QStringLiteral("a"));
    f.client.send(QStringLiteral("c1"), QStringLiteral("b"));
    QTRY_COMPARE(model.depth(), 2);
    QCOMPARE(f.client.pendingCount(), 2);
    QCOMPARE(model.get(0, im::OutboxModel::BodyRole).toString(), QStringLiteral("a"));
    QCOMPARE(model.get(0, im::OutboxModel::AttemptsRole).toInt(), 0);
    f.client.setRetryBackoff(800, 800);
    f.server.unavailable.insert(QStringLiteral("send"), 1);
    f.client.connectToServer();
    QTRY_VERIFY(!f.client.outbox().isEmpty() && f.client.outbox().first().lastError == u"UNAVAILABLE");
    const im::OutboxEntry e = f.client.outbox().first();
    QCOMPARE(e.attempts, 1);
    QVERIFY(e.nextRetryAt > QDateTime::currentDateTime());
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT last_error FROM outbox WHERE cmid = ?"), {e.cmid}).toString(),
             QStringLiteral("UNAVAILABLE"));
    QTRY_COMPARE_WITH_TIMEOUT(model.depth(), 0, 5000);
    QCOMPARE(f.client.pendingCount(), 0);
}

// Obligation 7 (idle cost): the outbox model is updated by rows from the
// outbox's own notifications, at once, never by a reset or a re-read of the
// whole outbox. 10,000 entries wait in conversation c1 (written straight into
// the store, as a long offline spell would leave them).
void TestClient::outbox_model_follows_one_send_row_by_row_on_a_long_backlog() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    f.client.close();
    constexpr int backlog = 10000;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("backlog"));
        db.setDatabaseName(f.db);
        QVERIFY(db.open());
        QVERIFY(db.transaction());
        QSqlQuery o(db), m(db);
        QVERIFY(o.prepare(QStringLiteral("INSERT INTO outbox(cmid, kind, conv, body, created_at) VALUES(?, 'send', 'c1', ?, ?)")));
        QVERIFY(m.prepare(QStringLiteral("INSERT INTO local_messages(cmid, kind, conv, body, created_at, state)"
                                         " VALUES(?, 'send', 'c1', ?, ?, 0)")));
        for (int i = 0; i < backlog; ++i) {
            const QString cmid = QUuid::createUuid().toString(QUuid::WithoutBraces);
            const QString body = QStringLiteral("backlog %1").arg(i);
            for (QSqlQuery *q : {&o, &m}) {
                q->addBindValue(cmid);
                q->addBindValue(body);
                q->addBindValue(QDateTime::currentMSecsSinceEpoch());
                QVERIFY2(q->exec(), qPrintable(q->lastError().text()));
            }
        }
        QVERIFY(db.commit());
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("backlog"));

    QVERIFY(f.client.open(f.db));
    im::OutboxModel model(&f.client);
    QCOMPARE(model.rowCount(), backlog);
    QCOMPARE(model.get(0, im::OutboxModel::BodyRole).toString(), QStringLiteral("backlog 0"));
    QSignalSpy resets(&model, &QAbstractItemModel::modelAboutToBeReset);
    QSignalSpy layouts(&model, &QAbstractItemModel::layoutAboutToBeChanged);
    QSignalSpy inserted(&model, &QAbstractItemModel::rowsInserted);
    QSignalSpy removed(&model, &QAbstractItemModel::rowsRemoved);
    QSignalSpy changed(&model, &QAbstractItemModel::dataChanged);

    // One send: one row inserted at the end, before send() returns.
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("one more"));
    QVERIFY(!cmid.isEmpty());
    QCOMPARE(inserted.size(), 1);
    QCOMPARE(inserted.at(0).at(1).toInt(), backlog);
    QCOMPARE(inserted.at(0).at(2).toInt(), backlog);
    QCOMPARE(model.rowCount(), backlog + 1);
    QCOMPARE(model.depth(), backlog + 1);
    QCOMPARE(model.get(backlog, im::OutboxModel::CmidRole).toString(), cmid);
    // Cancelled (never on the wire): that row removed, nothing else.
    QVERIFY(f.client.cancel(cmid));
    QCOMPARE(removed.size(), 1);
    QCOMPARE(removed.at(0).at(1).toInt(), backlog);
    QCOMPARE(removed.at(0).at(2).toInt(), backlog);
    QCOMPARE(model.rowCount(), backlog);

    // Connected, the server answering UNAVAILABLE: the conversation's first
    // `window` entries go on the wire (pipelined, each behind the one before)
    // and again after the head's back-off; only their rows change (attempts,
    // in flight), each by itself, never the rows behind them.
    const int window = im::ClientPrivate::get(&f.client)->outbox.window;
    QVERIFY(window < backlog / 2);
    f.server.unavailable.insert(QStringLiteral("send"), 1000000);
    f.client.connectToServer();
    QTRY_VERIFY(model.get(0, im::OutboxModel::AttemptsRole).toInt() >= 2);
    QVERIFY(!changed.isEmpty());
    for (const QList<QVariant> &c : std::as_const(changed)) {
        QVERIFY(c.at(0).toModelIndex().row() < window);
        QCOMPARE(c.at(1).toModelIndex().row(), c.at(0).toModelIndex().row());
    }
    QCOMPARE(model.get(window, im::OutboxModel::AttemptsRole).toInt(), 0);
    QCOMPARE(model.get(0, im::OutboxModel::LastErrorRole).toString(), QStringLiteral("UNAVAILABLE"));
    QCOMPARE(inserted.size(), 1);
    QCOMPARE(removed.size(), 1);
    QCOMPARE(resets.size(), 0);
    QCOMPARE(layouts.size(), 0);
    QCOMPARE(model.rowCount(), f.client.pendingCount());
}

void TestClient::qa_hooks_go_offline_drop_a_reply_and_close_the_socket() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    im::testing::Faults faults(&f.client);
    im::testing::Faults other(&f.client); // a second panel on the same client
    QSignalSpy offlineSpy(&other, &im::testing::Faults::offlineChanged);
    faults.setOffline(true);
    QVERIFY(other.isOffline());
    QCOMPARE(offlineSpy.size(), 1);
    QCOMPARE(offlineSpy.at(0).at(0).toBool(), true);
    QCOMPARE(f.client.connectionState(), ConnectionState::Disconnected);
    const QString queued = f.client.send(QStringLiteral("c1"), QStringLiteral("while offline"));
    // Offline means no reconnect: the transport is stopped, with no attempt
    // scheduled (a reconnect is an attempt of a running transport; only
    // setOffline(false) starts it again). The public state would read
    // Disconnected even for a transport waiting to reconnect.
    const im::detail::Transport *transport = im::ClientPrivate::get(&f.client)->conn.transport();
    QVERIFY(!transport->isRunning());
    QCOMPARE(transport->state(), im::detail::Transport::State::Idle);
    QVERIFY(!transport->nextAttemptAt().isValid());
    QCOMPARE(f.server.connections, 1);
    QCOMPARE(f.requestsOf(QStringLiteral("send")), 0);
    faults.setOffline(false);
    QVERIFY(!other.isOffline());
    QCOMPARE(offlineSpy.size(), 2);
    QTRY_COMPARE(f.client.messageState(queued), MessageState::Sent);
    // dropNextReply: the reply is ignored, the request is retried (same cmid).
    // It drops the next reply of any request, so first the ack of the first
    // message must have its answer: the client records `delivered` from the
    // `acked` reply (the ack goes out after the event is applied, debounced).
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 1);
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT delivered FROM conversations WHERE conv = 'c1'")).toLongLong(), 1);
    faults.dropNextReply();
    const QString dropped = f.client.send(QStringLiteral("c1"), QStringLiteral("reply dropped"));
    QTRY_COMPARE_WITH_TIMEOUT(f.client.messageState(dropped), MessageState::Sent, 5000);
    QCOMPARE(f.server.distinctCmids().count(dropped), 1);
    QCOMPARE(f.requestsOf(QStringLiteral("send")), 3);
    // closeSocketNow: reconnects by itself.
    const int conns = f.server.connections;
    faults.closeSocketNow();
    QTRY_COMPARE(f.server.connections, conns + 1);
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Connected);
}

// Small request/reply frames must not wait for a delayed ACK (issue 10).
void TestClient::socket_has_no_nagle_delay() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    const QVariant v = im::ClientPrivate::get(&f.client)->conn.transport()->socketOption(QAbstractSocket::LowDelayOption);
    QVERIFY(v.isValid());
    QCOMPARE(v.toInt(), 1);
}

// Obligation 12: a Failed row sorts where the user sent it, not below every
// newer message.
void TestClient::failed_message_stays_where_it_was_sent() {
    Fixture f;
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("before"));
    QVERIFY(f.openAndConnect());
    im::MessageListModel model(&f.client, QStringLiteral("c1"));
    QTRY_COMPARE(model.count(), 1);
    f.server.failWith.insert(QStringLiteral("send"), QStringLiteral("INVALID_ARGUMENT"));
    const QString failed = f.client.send(QStringLiteral("c1"), QStringLiteral("refused"));
    QTRY_COMPARE(f.client.messageState(failed), MessageState::Failed);
    f.server.failWith.clear();
    // What follows must carry a later wall-clock millisecond than the failed
    // message's creation (the failed row sorts after the events up to then).
    const qint64 failedAt =
        sqlScalar(f.db, QStringLiteral("SELECT created_at FROM local_messages WHERE cmid = ?"), {failed}).toLongLong();
    QVERIFY(failedAt > 0);
    QVERIFY(QTest::qWaitFor([failedAt] { return QDateTime::currentMSecsSinceEpoch() > failedAt; }, 5000));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("after"));
    f.server.pushToAll(QJsonObject{{QStringLiteral("t"), QStringLiteral("hint")}, {QStringLiteral("conv"), QStringLiteral("c1")},
                                   {QStringLiteral("head"), 2}, {QStringLiteral("epoch"), 1}});
    const QString later = f.client.send(QStringLiteral("c1"), QStringLiteral("later"));
    QTRY_COMPARE(f.client.messageState(later), MessageState::Sent);
    QTRY_COMPARE(model.count(), 4);
    QStringList bodies;
    for (int i = 0; i < model.count(); ++i)
        bodies << model.get(i, im::MessageListModel::BodyRole).toString();
    // Newest first (obligation 15).
    QCOMPARE(bodies, (QStringList{QStringLiteral("later"), QStringLiteral("after"), QStringLiteral("refused"),
                                  QStringLiteral("before")}));
    QCOMPARE(model.get(2, im::MessageListModel::StateRole).toInt(), int(MessageState::Failed));
}

// Issue 26 item 2. The server lost more of its tail than backlogLimit (a
// restore) and took one new message: the client's cursor is ahead, it
// rebuilds from the newest window and stops there; what the server lost is
// gone locally too. Before: the reset kept the old head, so every window
// looked "far behind" again and history was asked for forever.
void TestClient::a_server_restored_with_a_loss_above_the_backlog_limit_converges_without_a_loop() {
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
void TestClient::a_server_restored_with_a_loss_below_the_backlog_limit_drops_the_lost_events() {
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

// Issue 26 items 3 and 4. Hints and markers commit under
// synchronous=NORMAL and put FULL back; if that cannot be confirmed (here:
// a relaxed write failed at its PRAGMA, and the connection really was left
// at NORMAL), the next outbox write restores FULL before it writes.
void TestClient::an_outbox_write_never_runs_under_a_synchronous_left_relaxed() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    im::detail::Storage &st = im::ClientPrivate::get(&f.client)->storage;
    const QString c1 = QStringLiteral("c1");
    QVERIFY(st.ensureConversation(c1)); // a relaxed write (hint, markRead)
    QCOMPARE(st.pragma(QStringLiteral("synchronous")), QStringLiteral("2")); // FULL again
    st.injectFaultAfter(1);
    QVERIFY(!st.updateHead(c1, 5)); // fails at its PRAGMA: durability unknown
    st.pragma(QStringLiteral("synchronous=NORMAL")); // ... and left relaxed
    QCOMPARE(st.pragma(QStringLiteral("synchronous")), QStringLiteral("1"));
    const QString cmid = f.client.send(c1, QStringLiteral("must be flushed"));
    QVERIFY(!cmid.isEmpty());
    QCOMPARE(st.pragma(QStringLiteral("synchronous")), QStringLiteral("2"));
    QCOMPARE(f.outboxRows(), 1);
    // Where FULL cannot be put back, the outbox write fails instead.
    st.injectFaultAfter(1);
    QVERIFY(!st.updateHead(c1, 6));
    st.injectFaultAfter(1);
    QVERIFY(f.client.send(c1, QStringLiteral("not without a flush")).isEmpty());
    QCOMPARE(f.outboxRows(), 1);
}

// Issue 26 item 5. Ten unread messages, of which the client downloads only
// the newest window (2): the badge is the server's 10, not a local recount
// of what happens to be stored; new messages add to it, reading clears it.
void TestClient::unread_badge_is_the_servers_count_also_across_a_gap() {
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

// Issue 26 item 6. Our message was seq 1; the server, restored, gave seq 1
// to ben. His message is his (not "mine", not our cmid's state), ours is
// still there as ours.
void TestClient::own_messages_are_matched_by_cmid_not_by_seq() {
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

// Issue 26 item 13. A store used offline first: ana's draft, written under
// her token before the store ever met the server. Opened next with ben's
// token, the store becomes ben's; ana's draft never goes out as ben.
void TestClient::a_draft_written_under_another_users_token_is_never_sent() {
    QTemporaryDir dir;
    FakeServer server;
    QVERIFY(server.listen());
    const QString c1 = QStringLiteral("c1");
    server.convs[c1].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    const QString db = dir.filePath(QStringLiteral("shared.db"));
    QString draft;
    {
        Client ana;
        ana.setServers({server.url()});
        ana.setCredentials(QStringLiteral("tok-ana"));
        QVERIFY(ana.open(db));
        draft = ana.send(c1, QStringLiteral("ana's draft"));
        QVERIFY(!draft.isEmpty());
    }
    Client ben;
    ben.setServers({server.url()});
    ben.setCredentials(QStringLiteral("tok-ben"));
    QStringList codes;
    connect(&ben, &Client::errorOccurred, this, [&](const QString &code, const QString &) { codes.append(code); });
    QVERIFY(ben.open(db));
    ben.connectToServer();
    QTRY_COMPARE(ben.connectionState(), ConnectionState::Connected);
    const QString own = ben.send(c1, QStringLiteral("ben's own"));
    QTRY_COMPARE(ben.messageState(own), MessageState::Sent);
    for (const QJsonObject &req : server.requests(QStringLiteral("send")))
        QVERIFY(req.value(QStringLiteral("cmid")).toString() != draft);
    QCOMPARE(server.convs[c1].head(), 1);
    QCOMPARE(ben.messageState(draft), MessageState::Pending);
    QVERIFY(codes.contains(QStringLiteral("WRONG_USER")));
    QVERIFY(ben.cancel(draft)); // never sent: it can be dropped
}

void TestClient::a_draft_names_the_credential_it_was_written_under() {
    using im::Outbox;
    const auto b64 = [](const QByteArray &s) {
        return QString::fromLatin1(s.toBase64(QByteArray::Base64UrlEncoding | QByteArray::OmitTrailingEquals));
    };
    const QString jwt = b64(R"({"alg":"EdDSA","typ":"JWT"})") + u'.' + b64(R"({"sub":"ana","exp":4102444800})")
                        + QStringLiteral(".c2ln");
    QCOMPARE(Outbox::credentialOf(jwt), QStringLiteral("user:ana"));
    const QString opaque = Outbox::credentialOf(QStringLiteral("tok-ana"));
    QVERIFY(opaque.startsWith(QStringLiteral("token:")));
    QCOMPARE(opaque.size(), 6 + 64);
    QVERIFY(opaque != Outbox::credentialOf(QStringLiteral("tok-ben")));
    QVERIFY(!opaque.contains(QStringLiteral("tok-ana"))); // a fingerprint, not the secret
    QCOMPARE(Outbox::credentialOf(QString()), QString());
}

void TestClient::a_draft_whose_own_event_is_stored_before_its_answer_is_shown_once() {
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

void TestClient::an_older_window_of_a_void_epoch_is_not_stored() {
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

void TestClient::a_batched_retry_never_takes_back_the_attempts_on_the_wire() {
    // Found by fuzz_sdk_apply: answers are written in batches, so the retry
    // of attempt 1 can be written after attempt 2 went on the wire.
    QTemporaryDir dir;
    im::detail::Storage st;
    QVERIFY(st.open(dir.filePath(QStringLiteral("store.db"))));
    im::detail::OutboxRow row;
    row.cmid = QStringLiteral("cmid-1");
    row.kind = QStringLiteral("send");
    row.conv = QStringLiteral("c1");
    row.body = QStringLiteral("hello");
    row.createdAt = 1000;
    QVERIFY(st.enqueue(row) > 0);
    QVERIFY(st.markOnWire({{row.cmid, 1}}));
    QVERIFY(st.markOnWire({{row.cmid, 2}}));
    QVERIFY(st.settleOutbox({}, {im::detail::Storage::Retry{row.cmid, 1, QStringLiteral("UNAVAILABLE"), 0}}));
    const auto rows = st.loadOutbox();
    QVERIFY(rows);
    QCOMPARE(rows->size(), 1);
    QCOMPARE(rows->first().attempts, 2);
    QCOMPARE(rows->first().lastError, QStringLiteral("UNAVAILABLE"));
}

QTEST_GUILESS_MAIN(TestClient)
#include "tst_client.moc"

void TestClient::resend_after_reconnect_is_in_creation_order_across_conversations() {
    // Obligation 3: resendPending() (here: the first connection) sends the
    // outbox in creation order, also when the drafts interleave conversations.
    Fixture f;
    const QStringList convs = {QStringLiteral("c1"), QStringLiteral("c2"), QStringLiteral("c3"), QStringLiteral("c4")};
    for (const QString &c : convs)
        f.server.convs[c].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    QVERIFY(f.client.open(f.db));
    QStringList cmids;
    for (int i = 0; i < 12; ++i)
        cmids << f.client.send(convs.at(i % convs.size()), QStringLiteral("m%1").arg(i));
    f.client.connectToServer();
    QTRY_COMPARE(f.client.pendingCount(), 0);
    QStringList sent;
    for (const QJsonObject &o : std::as_const(f.server.received))
        if (o.value(QStringLiteral("t")).toString() == u"send")
            sent << o.value(QStringLiteral("cmid")).toString();
    QCOMPARE(sent, cmids);
}

void TestClient::the_on_the_wire_mark_is_written_with_a_flush() {
    // sdk.md, local database: outbox writes are synchronous=FULL. The mark
    // that an entry went on the wire decides whether cancel() may still drop
    // it; lost in a power cut, a message the others can read would look
    // unsent and could be cancelled.
    Fixture f;
    QVERIFY(f.openAndConnect());
    im::detail::Storage &st = im::ClientPrivate::get(&f.client)->storage;
    st.recordRelaxedWrites(true);
    // The mark is on disk before the frame leaves: read through a
    // connection of its own when the server sees the frame.
    qint64 attemptsOnDisk = -1;
    f.server.onFrame = [&](const QJsonObject &o) {
        if (o.value(QStringLiteral("t")).toString() == u"send")
            attemptsOnDisk = sqlScalar(f.db, QStringLiteral("SELECT attempts FROM outbox WHERE cmid = ?"),
                                       {o.value(QStringLiteral("cmid")).toString()})
                                 .toLongLong();
    };
    f.client.send(QStringLiteral("c1"), QStringLiteral("flushed"));
    QTRY_COMPARE(f.client.pendingCount(), 0);
    QCOMPARE(attemptsOnDisk, 1);
    const QStringList relaxed = st.relaxedWrites();
    // The answer's write is relaxed (a resend is answered dup): the hook sees it.
    QVERIFY2(std::any_of(relaxed.cbegin(), relaxed.cend(),
                         [](const QString &s) { return s.startsWith(u"DELETE FROM outbox"); }),
             qPrintable(relaxed.join(u'|')));
    // Neither the mark nor the entry itself is ever written relaxed.
    for (const QString &s : relaxed) {
        QVERIFY2(!s.startsWith(u"UPDATE outbox SET attempts = ? "), qPrintable(s));
        QVERIFY2(!s.startsWith(u"INSERT INTO outbox"), qPrintable(s));
    }
}
