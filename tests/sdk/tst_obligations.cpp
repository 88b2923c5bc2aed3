// The SDK's obligations 9-13 (spec/sdk.md) against the real imserver
// (embedded PostgreSQL), started by the harness in realserver.h.
// Demo data: users ana, ben, cy; direct conv "ana-ben"; group "team".
#include "exerelative.h"
#include "realclient.h"
#include "sdktestutil.h"

#include <im/client.h>
#include <im/messagelistmodel.h>

#include <QtCore/QTemporaryDir>
#include <QtTest/QSignalSpy>
#include <QtTest/QtTest>

#include <csignal>
#include <memory>
#include <sys/types.h>

#ifndef IM_SERVER_BIN
#error "IM_SERVER_BIN must name the imserver executable"
#endif

using im::Client;
using im::ConnectionState;
using im::MessageState;

namespace {

// Resumes a stopped server however the test ends.
struct Stopped {
    explicit Stopped(qint64 pid) : pid(pid) { ::kill(pid_t(pid), SIGSTOP); }
    ~Stopped() { resume(); }
    void resume() {
        if (pid > 0)
            ::kill(pid_t(pid), SIGCONT);
        pid = 0;
    }
    qint64 pid;
};

} // namespace

class TestObligations : public QObject {
    Q_OBJECT
private slots:
    void cleanup();
    void batches_failing_together_keep_per_conversation_send_order();
    void a_failed_head_is_not_overtaken_by_later_messages();
    void a_store_refuses_another_users_welcome();
    void a_draft_queued_offline_under_one_user_never_goes_out_as_another();
    void a_silent_server_is_noticed_and_the_client_reconnects();
    void a_silent_server_is_noticed_within_a_minute_with_the_default_keep_alive();
    void send_refuses_what_the_server_would_refuse_and_accepts_its_limit();
    void cancel_withdraws_an_unsent_message_and_discard_drops_a_failed_one();

private:
    std::unique_ptr<RealServer> start(const QStringList &args = {});
    std::unique_ptr<Client> makeClient(RealServer &server, const QString &user, const QString &db);

    QTemporaryDir dir_;
};

void TestObligations::cleanup() {}

std::unique_ptr<RealServer> TestObligations::start(const QStringList &args) {
    auto server = std::make_unique<RealServer>(exeRelativePath(IM_SERVER_BIN));
    server->serverArgs = args;
    const QString error = server->start();
    if (!error.isEmpty()) {
        qWarning("%s", qPrintable(error));
        return nullptr;
    }
    return server;
}

std::unique_ptr<Client> TestObligations::makeClient(RealServer &server, const QString &user, const QString &db) {
    return makeRealClient(server, user, dir_.filePath(db));
}

// Obligation 9: the server answers UNAVAILABLE again and again (8 faults)
// while 60 interleaved sends to two conversations wait, then the retries go
// through. Every message of a conversation must still get its seq in
// creation order: retries wait behind the conversation's head, not each on
// its own timer, and a failing conversation does not stop the other.
void TestObligations::batches_failing_together_keep_per_conversation_send_order() {
    auto server = start({QStringLiteral("--enable-faults"), QStringLiteral("--fault"),
                         QStringLiteral("store.before_commit=unavailable:8")});
    QVERIFY(server);
    auto ana = makeClient(*server, QStringLiteral("ana"), QStringLiteral("order.db"));
    QVERIFY(ana->isOpen());
    const QStringList convs{QStringLiteral("team"), QStringLiteral("ana-ben")};
    QHash<QString, QStringList> sent; // conv -> cmids in creation order
    for (int i = 0; i < 60; ++i) {
        const QString conv = convs.at(i % 2);
        const QString cmid = ana->send(conv, QStringLiteral("ordered %1").arg(i));
        QVERIFY(!cmid.isEmpty());
        sent[conv].append(cmid);
    }
    QHash<QString, qint64> seqOf;
    QStringList failed;
    connect(ana.get(), &Client::messageStateChanged, this,
            [&](const QString &, const QString &cmid, qint64 seq, MessageState st, const QString &code) {
                if (st == MessageState::Sent)
                    seqOf.insert(cmid, seq);
                else if (st != MessageState::Pending)
                    failed.append(code);
            });
    QSet<QString> unavailable; // cmids seen waiting for a retry after UNAVAILABLE
    connect(ana.get(), &Client::outboxChanged, this, [&] {
        for (const im::OutboxEntry &e : ana->outbox())
            if (e.lastError() == u"UNAVAILABLE")
                unavailable.insert(e.cmid());
    });
    ana->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->pendingCount(), 0, 120000);
    QVERIFY2(failed.isEmpty(), qPrintable(failed.join(u',')));
    for (const QString &conv : convs) {
        qint64 last = 0;
        for (const QString &cmid : sent.value(conv)) {
            const qint64 seq = seqOf.value(cmid);
            QVERIFY2(seq > last, qPrintable(QStringLiteral("%1: seq %2 after %3").arg(conv).arg(seq).arg(last)));
            last = seq;
        }
    }
    // The faults did fire on a conversation's head, with later messages of
    // that conversation pipelined behind it (sends are pipelined, each naming
    // the one before as `prev`; which conversation's transactions used up
    // the 8 faults depends on how the server's reads cut the runs).
    const QStringList &first = sent.value(convs.at(0)), &second = sent.value(convs.at(1));
    QVERIFY(unavailable.contains(first.first()) || unavailable.contains(second.first()));
    QVERIFY(unavailable.contains(first.at(1)) || unavailable.contains(second.at(1)));
}

// Obligation 9, the case that naive pipelining gets wrong: a backlog of 30
// messages of one conversation, and the server fails only the first request
// that reaches it (UNAVAILABLE, one fault). Messages 2..30 are on the wire
// behind message 1; had they not named it as `prev`, the server would
// commit them (its fault is spent) and message 1 would get seq 31 on its
// retry.
void TestObligations::a_failed_head_is_not_overtaken_by_later_messages() {
    auto server = start({QStringLiteral("--enable-faults"), QStringLiteral("--fault"),
                         QStringLiteral("store.before_insert=unavailable:1")});
    QVERIFY(server);
    auto ana = makeClient(*server, QStringLiteral("ana"), QStringLiteral("head.db"));
    QVERIFY(ana->isOpen());
    QStringList sent;
    for (int i = 0; i < 30; ++i) {
        const QString cmid = ana->send(QStringLiteral("team"), QStringLiteral("backlog %1").arg(i));
        QVERIFY(!cmid.isEmpty());
        sent.append(cmid);
    }
    QHash<QString, qint64> seqOf;
    connect(ana.get(), &Client::messageStateChanged, this,
            [&](const QString &, const QString &cmid, qint64 seq, MessageState st, const QString &) {
                if (st == MessageState::Sent)
                    seqOf.insert(cmid, seq);
            });
    bool headFailed = false, secondRefused = false;
    connect(ana.get(), &Client::outboxChanged, this, [&] {
        for (const im::OutboxEntry &e : ana->outbox()) {
            if (e.cmid() == sent.first() && e.lastError() == u"UNAVAILABLE")
                headFailed = true;
            if (e.cmid() == sent.at(1) && e.lastError() == u"UNAVAILABLE")
                secondRefused = true;
        }
    });
    ana->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->pendingCount(), 0, 120000);
    QVERIFY(headFailed);    // the fault did fire, on message 1
    QVERIFY(secondRefused); // message 2 was on the wire behind it, and held back
    qint64 last = 0;
    for (const QString &cmid : std::as_const(sent)) {
        const qint64 seq = seqOf.value(cmid);
        QVERIFY2(seq > last, qPrintable(QStringLiteral("seq %1 after %2").arg(seq).arg(last)));
        last = seq;
    }
}

// Obligation 10: the store belongs to the user of its first welcome. With
// ben's token on ana's store the client refuses ben's welcome for good: ana's
// draft is not sent as ben, the identity stays ana's, nothing reconnects.
// Back with ana's token the draft goes out as ana, once.
void TestObligations::a_store_refuses_another_users_welcome() {
    auto server = start();
    QVERIFY(server);
    auto ana = makeClient(*server, QStringLiteral("ana"), QStringLiteral("owned.db"));
    QVERIFY(ana->isOpen());
    ana->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 60000);
    QCOMPARE(ana->userId(), QStringLiteral("ana"));
    ana->disconnectFromServer();
    const QString draft = ana->send(QStringLiteral("ana-ben"), QStringLiteral("ana's draft"));
    QVERIFY(!draft.isEmpty());

    QStringList codes;
    connect(ana.get(), &Client::errorOccurred, this, [&](const QString &code, const QString &) { codes.append(code); });
    QSignalSpy identity(ana.get(), &Client::identityChanged);
    QSignalSpy typed(ana.get(), &Client::errorReported);
    ana->setCredentials(server->tokens.value(QStringLiteral("ben")));
    ana->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(codes.contains(QStringLiteral("WRONG_USER")), 60000);
    QCOMPARE(ana->connectionState(), ConnectionState::Disconnected);
    QVERIFY2(ana->lastError().contains(QStringLiteral("belongs to user ana")), qPrintable(ana->lastError()));
    QVERIFY(std::any_of(typed.cbegin(), typed.cend(),
                        [](const QList<QVariant> &a) { return a.at(0).value<im::Error>() == im::Error::WrongUser; }));
    QCOMPARE(ana->userId(), QStringLiteral("ana"));
    QCOMPARE(identity.size(), 0);
    QCOMPARE(ana->pendingCount(), 1);
    QCOMPARE(ana->messageState(draft), MessageState::Pending);

    ana->setCredentials(server->tokens.value(QStringLiteral("ana")));
    ana->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(draft), MessageState::Sent, 60000);
    QCOMPARE(codes.count(QStringLiteral("WRONG_USER")), 1); // refused once, no reconnect loop

    // What the server stored: ben's own store shows the draft once, from ana.
    auto ben = makeClient(*server, QStringLiteral("ben"), QStringLiteral("ben.db"));
    QSignalSpy synced(ben.get(), &Client::conversationSynced);
    ben->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(synced.count() > 0 && [&] {
        for (const QList<QVariant> &args : std::as_const(synced))
            if (args.at(0).toString() == u"ana-ben")
                return true;
        return false;
    }(), 60000);
    im::MessageListModel view(ben.get(), QStringLiteral("ana-ben"));
    view.refresh();
    QStringList senders;
    for (int r = 0; r < view.count(); ++r)
        if (view.get(r, im::MessageListModel::BodyRole).toString() == u"ana's draft")
            senders.append(view.get(r, im::MessageListModel::SenderRole).toString());
    QCOMPARE(senders, QStringList{QStringLiteral("ana")});
}

// Obligation 11: the server stops answering (SIGSTOP: the TCP connection
// stays up, nothing comes back). The client must notice by itself and leave
// Connected, then reconnect once the server is back, and send what waited.
void TestObligations::a_silent_server_is_noticed_and_the_client_reconnects() {
    auto server = start();
    QVERIFY(server);
    auto ana = makeClient(*server, QStringLiteral("ana"), QStringLiteral("liveness.db"));
    ana->setKeepAlive(300, 1500);
    ana->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 30000);
    {
        Stopped stopped(server->pid());
        QTRY_VERIFY_WITH_TIMEOUT(ana->connectionState() != ConnectionState::Connected, 20000);
        const QString cmid = ana->send(QStringLiteral("team"), QStringLiteral("after the silence"));
        QVERIFY(!cmid.isEmpty());
        stopped.resume();
        QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 60000);
        QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(cmid), MessageState::Sent, 30000);
    }
}

// Obligation 11 with the shipped keep-alive (issue 48): the test leaves
// pingInterval and silenceTimeout at their defaults. A server that stops
// answering (SIGSTOP: the TCP connection stays open, no pong, no frame) is
// noticed well under a minute, with nothing of the client's own on the wire
// that a request timeout could notice instead.
void TestObligations::a_silent_server_is_noticed_within_a_minute_with_the_default_keep_alive() {
    auto server = start();
    QVERIFY(server);
    auto ana = makeClient(*server, QStringLiteral("ana"), QStringLiteral("defaults.db"));
    const Client defaults;
    QCOMPARE(ana->pingInterval(), defaults.pingInterval());
    QCOMPARE(ana->silenceTimeout(), defaults.silenceTimeout());
    ana->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 30000);
    // The session's own traffic answered: a message sent and confirmed.
    const QString first = ana->send(QStringLiteral("team"), QStringLiteral("before the silence"));
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(first), MessageState::Sent, 30000);
    QSignalSpy states(ana.get(), &Client::connectionStateChanged);
    {
        Stopped stopped(server->pid());
        QTRY_VERIFY_WITH_TIMEOUT(ana->connectionState() != ConnectionState::Connected, 60000);
        QVERIFY(!states.isEmpty());
        stopped.resume();
        QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 60000);
    }
}

// Obligation 12: bad input never enters the outbox; the limit itself is sent.
void TestObligations::send_refuses_what_the_server_would_refuse_and_accepts_its_limit() {
    auto server = start();
    QVERIFY(server);
    auto ana = makeClient(*server, QStringLiteral("ana"), QStringLiteral("limits.db"));
    QSignalSpy errors(ana.get(), &Client::errorOccurred);
    const QString tooLong(4001, u'a');
    const QString lone = QStringLiteral("half ") + QChar(0xD83D);
    const QString nul = QStringLiteral("a") + QChar(0) + QStringLiteral("b");
    const QList<QPair<QString, QString>> bad{{QStringLiteral("team"), tooLong},
                                             {QStringLiteral("team"), QString()},
                                             {QStringLiteral("team"), lone},
                                             {QStringLiteral("team"), nul},
                                             {QStringLiteral("no spaces allowed"), QStringLiteral("x")}};
    for (const auto &[conv, body] : bad) {
        QVERIFY(ana->send(conv, body).isEmpty());
        QCOMPARE(errors.last().at(0).toString(), QStringLiteral("INVALID_ARGUMENT"));
    }
    QCOMPARE(ana->pendingCount(), 0);
    QCOMPARE(sqlScalar(ana->databasePath(), QStringLiteral("SELECT COUNT(*) FROM local_messages")).toInt(), 0);
    // 4000 code points that are 8000 UTF-16 units and 16000 UTF-8 bytes: the
    // server takes it.
    QString emoji;
    for (int i = 0; i < 4000; ++i)
        emoji += QString::fromUcs4(U"\U0001F600", 1);
    const QString cmid = ana->send(QStringLiteral("team"), emoji);
    QVERIFY(!cmid.isEmpty());
    ana->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(cmid), MessageState::Sent, 30000);
}

// Obligation 12: cancel() withdraws a Pending message before it goes on the
// wire (the server never sees it); a sent one cannot be cancelled; discard()
// drops a Failed one from the timeline.
void TestObligations::cancel_withdraws_an_unsent_message_and_discard_drops_a_failed_one() {
    auto server = start();
    QVERIFY(server);
    auto ana = makeClient(*server, QStringLiteral("ana"), QStringLiteral("cancel.db"));
    const QString keep = ana->send(QStringLiteral("team"), QStringLiteral("kept"));
    const QString gone = ana->send(QStringLiteral("team"), QStringLiteral("cancelled"));
    QVERIFY(ana->cancel(gone));
    QVERIFY(!ana->cancel(gone)); // no longer there
    QCOMPARE(ana->pendingCount(), 1);
    QCOMPARE(sqlScalar(ana->databasePath(), QStringLiteral("SELECT COUNT(*) FROM local_messages WHERE cmid = ?"), {gone})
                 .toInt(),
             0);
    // Withdrawn on disk too: a restart does not bring it back.
    QCOMPARE(sqlScalar(ana->databasePath(), QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid = ?"), {gone}).toInt(), 0);
    QCOMPARE(sqlScalar(ana->databasePath(), QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid = ?"), {keep}).toInt(), 1);
    const QString doomed = ana->send(QStringLiteral("nowhere"), QStringLiteral("not a member"));
    ana->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(keep), MessageState::Sent, 30000);
    QVERIFY(!ana->cancel(keep)); // sent: only recall can undo it
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(doomed), MessageState::Failed, 30000);
    QVERIFY(!ana->discard(keep)); // Sent messages are not discarded
    QVERIFY(ana->discard(doomed));
    QCOMPARE(sqlScalar(ana->databasePath(), QStringLiteral("SELECT COUNT(*) FROM local_messages WHERE cmid = ?"), {doomed})
                 .toInt(),
             0);
    // What ben sees of team: "kept", never "cancelled".
    auto ben = makeClient(*server, QStringLiteral("ben"), QStringLiteral("cancel-ben.db"));
    ben->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(sqlScalar(ben->databasePath(), QStringLiteral("SELECT COUNT(*) FROM events WHERE body = 'kept'"))
                                     .toInt()
                                 == 1,
                             30000);
    QTRY_VERIFY_WITH_TIMEOUT(!ben->conversationIds().isEmpty(), 30000);
    QCOMPARE(sqlScalar(ben->databasePath(), QStringLiteral("SELECT COUNT(*) FROM events WHERE body = 'cancelled'")).toInt(),
             0);
}

// Issue 26 item 13 against the real server (its device tokens): a store
// used offline first, ana's draft written under her token before the store
// ever connected; the store is then opened with ben's token. The store
// becomes ben's, his own message goes out, ana's draft never does.
void TestObligations::a_draft_queued_offline_under_one_user_never_goes_out_as_another() {
    auto server = start();
    QVERIFY(server);
    const QString conv = QStringLiteral("ana-ben");
    QString draft;
    {
        auto ana = makeClient(*server, QStringLiteral("ana"), QStringLiteral("first-offline.db"));
        QVERIFY(ana->isOpen());
        draft = ana->send(conv, QStringLiteral("ana's offline draft"));
        QVERIFY(!draft.isEmpty());
    }
    auto ben = makeClient(*server, QStringLiteral("ben"), QStringLiteral("first-offline.db"));
    QVERIFY(ben->isOpen());
    QStringList codes;
    connect(ben.get(), &Client::errorOccurred, this, [&](const QString &code, const QString &) { codes.append(code); });
    ben->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ben->connectionState(), ConnectionState::Connected, 60000);
    QCOMPARE(ben->userId(), QStringLiteral("ben"));
    const QString own = ben->send(conv, QStringLiteral("ben's own"));
    QTRY_COMPARE_WITH_TIMEOUT(ben->messageState(own), MessageState::Sent, 60000);
    QCOMPARE(ben->messageState(draft), MessageState::Pending);
    QVERIFY(codes.contains(QStringLiteral("DRAFTS_HELD")));
    QVERIFY(!codes.contains(QStringLiteral("WRONG_USER"))); // the session goes on: no refusal reported

    // What the server stored, seen by a fresh store of ana's.
    auto check = makeClient(*server, QStringLiteral("ana"), QStringLiteral("ana-check.db"));
    QSignalSpy synced(check.get(), &Client::conversationSynced);
    check->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(std::any_of(synced.cbegin(), synced.cend(),
                                         [&](const QList<QVariant> &a) { return a.at(0).toString() == conv; }),
                             60000);
    const QString db = dir_.filePath(QStringLiteral("ana-check.db"));
    const auto count = [&](const QString &body) {
        return sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = ? AND body = ?"), {conv, body})
            .toLongLong();
    };
    QCOMPARE(count(QStringLiteral("ben's own")), 1);
    QCOMPARE(count(QStringLiteral("ana's offline draft")), 0);
}

QTEST_GUILESS_MAIN(TestObligations)
#include "tst_obligations.moc"
