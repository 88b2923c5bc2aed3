// Obligation 11 (spec/sdk.md): timers use a monotonic clock, so a wall-clock
// jump never stalls the outbox or fires every timeout at once; and the API
// never blocks the thread.
//
// The wall clock is moved for this process only: the test program defines
// clock_gettime() and gettimeofday(), which the dynamic linker binds before
// libc's for Qt, libstdc++ and SQLite too, and adds a shift to the realtime
// clocks only (CLOCK_MONOTONIC and the others pass through untouched). Each
// test first checks that QDateTime really moved, so a build in which the
// interposition does not take cannot pass for the wrong reason.
#include "fakeserver.h"
#include "sdktestutil.h"

#include <im/client.h>

#include <QtCore/QDateTime>
#include <QtCore/QElapsedTimer>
#include <QtCore/QTemporaryDir>
#include <QtNetwork/QHostAddress>
#include <QtNetwork/QTcpServer>
#include <QtNetwork/QTcpSocket>
#include <QtTest/QSignalSpy>
#include <QtTest/QtTest>

#include <atomic>
#include <ctime>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

namespace {
std::atomic<long long> g_shift_ms{0}; // added to the realtime clocks

void shift(struct timespec *ts) {
    const long long ns = static_cast<long long>(ts->tv_nsec) + (g_shift_ms.load() % 1000) * 1000000LL;
    ts->tv_sec += static_cast<time_t>(g_shift_ms.load() / 1000 + ns / 1000000000LL - (ns < 0 ? 1 : 0));
    ts->tv_nsec = static_cast<long>(((ns % 1000000000LL) + 1000000000LL) % 1000000000LL);
}
} // namespace

extern "C" int clock_gettime(clockid_t id, struct timespec *ts) {
    const int r = static_cast<int>(::syscall(SYS_clock_gettime, id, ts));
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        shift(ts);
    return r;
}

extern "C" int gettimeofday(struct timeval *tv, void *) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec; // never null: glibc declares it nonnull
    tv->tv_usec = static_cast<suseconds_t>(ts.tv_nsec / 1000);
    return 0;
}

using im::Client;
using im::ConnectionState;
using im::MessageState;

class TestWallClock : public QObject {
    Q_OBJECT
private slots:
    void cleanup() { g_shift_ms = 0; }
    void wall_clock_jumps_neither_stall_the_outbox_nor_fire_timeouts_early();
    void the_api_never_blocks_the_thread_on_a_server_that_never_answers();
};

// One send whose replies are lost 4 times: the client retries after its
// request timeout plus a jittered backoff. While it waits out the first
// backoff the wall clock jumps a day forward, while it waits out the second
// two days back (a day behind the true time), and while its third attempt
// is on the wire two days forward again. A retry timer on the wall clock
// would fire at once after a forward jump or wait a day after the backward
// one (the outbox stalls, the message is never Sent); a request deadline on
// the wall clock would time the third attempt out at once. The keep-alive
// watchdog must not see a day of silence either: the connection stays up
// throughout.
void TestWallClock::wall_clock_jumps_neither_stall_the_outbox_nor_fire_timeouts_early() {
    QTemporaryDir dir;
    FakeServer server;
    QVERIFY(server.listen());
    server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    Client client;
    client.setServers({server.url()});
    client.setCredentials(QStringLiteral("tok-ana"));
    const int timeout = 300, initial = 100, cap = 400;
    client.setRequestTimeout(timeout);
    client.setRetryBackoff(initial, cap);
    client.setKeepAlive(200, 2000);
    QVERIFY(client.open(dir.filePath(QStringLiteral("client.db"))));
    client.connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(client.connectionState(), ConnectionState::Connected, 10000);
    QSignalSpy states(&client, &Client::connectionStateChanged);

    server.dropReplies.insert(QStringLiteral("send"), 4);
    QList<qint64> at;
    QElapsedTimer clock;
    clock.start();
    server.onFrame = [&](const QJsonObject &req) {
        if (req.value(QStringLiteral("t")).toString() == u"send")
            at << clock.elapsed();
    };
    // The first two jumps land while the entry waits out a backoff: its
    // request timed out (not in flight) and its next attempt is not on the
    // wire yet; the third while its third attempt waits for its reply.
    QList<int> jumpedAfterFrames;
    QList<qint64> wallAfterJump;
    QTimer poll;
    connect(&poll, &QTimer::timeout, this, [&] {
        const auto entries = client.outbox();
        const int n = int(jumpedAfterFrames.size());
        if (entries.size() != 1 || n >= 3)
            return;
        const int attempts = entries[0].attempts();
        const bool wantInFlight = n == 2;
        if (entries[0].isInFlight() != wantInFlight || attempts != (wantInFlight ? 3 : n + 1) || at.size() != attempts)
            return;
        g_shift_ms = n == 0 ? 24LL * 3600 * 1000 : n == 1 ? -24LL * 3600 * 1000 : 24LL * 3600 * 1000;
        jumpedAfterFrames << int(at.size());
        wallAfterJump << QDateTime::currentMSecsSinceEpoch();
    });
    poll.start(2);
    const qint64 wallBefore = QDateTime::currentMSecsSinceEpoch();
    const QString cmid = client.send(QStringLiteral("c1"), QStringLiteral("across the jumps"));
    QVERIFY(!cmid.isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(jumpedAfterFrames.size(), 3, 10000);
    // The jumps took: the process's wall clock was a day ahead, a day
    // behind, then a day ahead again.
    QVERIFY2(wallAfterJump[0] > wallBefore + 23LL * 3600 * 1000 && wallAfterJump[1] < wallBefore - 23LL * 3600 * 1000
                 && wallAfterJump[2] > wallBefore + 23LL * 3600 * 1000,
             "the wall-clock shift did not reach QDateTime: the test would prove nothing");
    QTRY_COMPARE_WITH_TIMEOUT(client.messageState(cmid), MessageState::Sent, 20000);
    poll.stop();
    // The first two jumps came in a backoff wait, the third with attempt 3
    // on the wire.
    QCOMPARE(jumpedAfterFrames, (QList<int>{1, 2, 3}));
    QCOMPARE(at.size(), 5);
    for (int i = 1; i < at.size(); ++i) {
        const qint64 d = std::min<qint64>(cap, qint64(initial) << (i - 1));
        const qint64 gap = at[i] - at[i - 1];
        // Never earlier than the request timeout plus the backoff's lower
        // half (less 10 ms of timer rounding): nothing fired at once.
        QVERIFY2(gap >= timeout + d / 2 - 10,
                 qPrintable(QStringLiteral("retry %1 after %2 ms, expected at least %3").arg(i).arg(gap).arg(timeout + d / 2)));
    }
    QCOMPARE(states.count(), 0); // the watchdog saw no day of silence
    QCOMPARE(client.connectionState(), ConnectionState::Connected);
}

// A server that accepts the TCP connection and never answers anything (no
// WebSocket handshake). With request timeouts of a minute, an API call that
// waited on the network would take a minute; every call returns at once and
// the event loop keeps turning while the connection hangs.
void TestWallClock::the_api_never_blocks_the_thread_on_a_server_that_never_answers() {
    QTemporaryDir dir;
    QTcpServer silent;
    QVERIFY(silent.listen(QHostAddress::LocalHost));
    QList<QTcpSocket *> held;
    connect(&silent, &QTcpServer::newConnection, this, [&] {
        while (auto *s = silent.nextPendingConnection())
            held << s; // read nothing, write nothing
    });
    Client client;
    client.setServers({QUrl(QStringLiteral("ws://127.0.0.1:%1/v1/ws").arg(silent.serverPort()))});
    client.setCredentials(QStringLiteral("tok-ana"));
    client.setRequestTimeout(60000);
    client.setKeepAlive(20000, 60000);
    QVERIFY(client.open(dir.filePath(QStringLiteral("client.db"))));
    client.connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(!held.isEmpty(), 10000); // the TCP connection is up, the handshake hangs
    QElapsedTimer clock;
    clock.start();
    QStringList cmids;
    for (int i = 0; i < 50; ++i)
        cmids << client.send(QStringLiteral("c1"), QStringLiteral("m%1").arg(i));
    client.sync(QStringLiteral("c1"));
    client.markRead(QStringLiteral("c1"), 1);
    client.recall(QStringLiteral("c1"), 1);
    const int pending = client.pendingCount();
    const auto outbox = client.outbox();
    client.disconnectFromServer();
    client.connectToServer();
    const qint64 calls = clock.elapsed();
    // The event loop turns while the connection still hangs.
    bool turned = false;
    QTimer::singleShot(0, this, [&] { turned = true; });
    QTRY_VERIFY_WITH_TIMEOUT(turned, 30000);
    const qint64 total = clock.elapsed();
    for (const auto &c : cmids)
        QVERIFY(!c.isEmpty());
    QVERIFY(pending >= 50);
    QVERIFY(outbox.size() >= 50);
    QVERIFY(client.connectionState() != ConnectionState::Connected);
    // A blocking call would have waited for a request timeout (60 s);
    // the bound is half of it, so no scheduling delay can reach it.
    QVERIFY2(calls < 30000 && total < 30000,
             qPrintable(QStringLiteral("the API calls took %1 ms, the loop turned after %2 ms").arg(calls).arg(total)));
    qDeleteAll(held);
}

QTEST_GUILESS_MAIN(TestWallClock)
#include "tst_wallclock.moc"
