// Benchmark (issue 26 item 4; not a timed test, figures go to docs/sdk.md):
// a 500-member group's incoming messages on the client's thread (the GUI
// thread of an app). A group above push_full_max gets a `hint` per message
// instead of the event: the client records the head (one write), syncs (a
// request) and stores the page (one write), and the models reload. Baseline
// in the same run: the same messages pushed as full `event`s (a group of at
// most push_full_max members). The fake server runs in a thread of its own,
// so the client's thread does only the client's work; the two views an app
// has (conversation list, timeline) are bound to the client.
//
// For each mode: messages/s until the client's cursor reaches the head,
// CPU ms the client's thread spent per message (CLOCK_THREAD_CPUTIME_ID),
// and sync requests per message; then the ratios hint/event.
//
// With --interval the messages come at a steady rate: the client's thread
// is then mostly idle, and CPU ms per message says how many messages per
// second it could take (1000 / that), a sync per hint included.
//
// Usage: bench_hints [--count N] [--members M] [--rounds R] [--interval MS] [--dir DIR]
#include "fakeserver.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>

#include <QtCore/QCommandLineParser>
#include <QtCore/QCoreApplication>
#include <QtCore/QElapsedTimer>
#include <QtCore/QEventLoop>
#include <QtCore/QTimer>
#include <QtCore/QJsonObject>
#include <QtCore/QTemporaryDir>
#include <QtCore/QThread>
#include <QtTest/QtTest>

#include <cstdio>
#include <ctime>

namespace {

double threadCpuMs() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

struct Figures {
    double perSecond = 0;
    double cpuMsPerMessage = 0;
    double syncsPerMessage = 0;
};

// One round: a fresh store, `count` messages from ben into `conv`, pushed as
// hints (hints == true) or as events.
Figures round(FakeServer *server, const QString &dir, const QString &conv, int count, bool hints, int n,
              int intervalMs) {
    im::Client client;
    client.setServers({server->url()});
    client.setCredentials(QStringLiteral("tok-ana"));
    im::ConversationListModel convs(&client);
    im::MessageListModel timeline(&client, conv);
    if (!client.open(QStringLiteral("%1/%2-%3.db").arg(dir, hints ? QStringLiteral("hint") : QStringLiteral("event")).arg(n)))
        qFatal("open: %s", qPrintable(client.lastError()));
    qint64 cursor = 0;
    qint64 waitFor = 0; // > 0: quit `loop` once the cursor reaches it
    QEventLoop loop;    // not QTest::qWaitFor: it sleeps between passes
    QObject::connect(&client, &im::Client::eventsApplied, &client, [&](const QString &c, qint64, qint64 to) {
        if (c != conv)
            return;
        cursor = std::max(cursor, to);
        if (waitFor > 0 && cursor >= waitFor)
            loop.quit();
    });
    client.connectToServer();
    qint64 head = 0;
    QMetaObject::invokeMethod(server, [&] { head = server->convs[conv].head(); }, Qt::BlockingQueuedConnection);
    if (!QTest::qWaitFor([&] { return cursor >= head && timeline.count() > 0; }, 60000))
        qFatal("the client never caught up with the conversation (cursor %lld of %lld)", cursor, head);
    QTest::qWait(300); // the session's own convs walk is over
    int syncsBefore = 0;
    QMetaObject::invokeMethod(server, [&] { syncsBefore = int(server->requests(QStringLiteral("sync")).size()); },
                              Qt::BlockingQueuedConnection);

    const double cpu0 = threadCpuMs();
    QElapsedTimer wall;
    wall.start();
    // The server commits and pushes the messages one by one: as fast as it
    // can (a burst), or one every intervalMs (a busy group at a steady rate).
    QMetaObject::invokeMethod(server, [server, conv, count, hints, intervalMs] {
        server->pushEvents = !hints;
        auto one = [server, conv, hints](int i) {
            const qint64 seq = server->append(conv, QStringLiteral("ben"), QStringLiteral("message %1").arg(i));
            if (hints)
                server->pushToAll(QJsonObject{{QStringLiteral("t"), QStringLiteral("hint")},
                                              {QStringLiteral("conv"), conv},
                                              {QStringLiteral("head"), seq},
                                              {QStringLiteral("epoch"), server->convs[conv].epoch}});
        };
        if (intervalMs <= 0) {
            for (int i = 0; i < count; ++i)
                one(i);
            return;
        }
        auto *timer = new QTimer(server);
        auto *sent = new int(0);
        QObject::connect(timer, &QTimer::timeout, server, [timer, sent, count, one] {
            one((*sent)++);
            if (*sent == count) {
                timer->deleteLater();
                delete sent;
            }
        });
        timer->start(intervalMs);
    }, Qt::QueuedConnection);
    const qint64 target = head + count;
    waitFor = target;
    QTimer::singleShot(300000, &loop, &QEventLoop::quit);
    if (cursor < target)
        loop.exec();
    if (cursor < target)
        qFatal("not all messages arrived (cursor %lld of %lld)", cursor, target);
    const qint64 ms = std::max<qint64>(1, wall.elapsed());
    const double cpu = threadCpuMs() - cpu0;
    int syncsAfter = 0;
    QMetaObject::invokeMethod(server, [&] { syncsAfter = int(server->requests(QStringLiteral("sync")).size()); },
                              Qt::BlockingQueuedConnection);
    client.disconnectFromServer();
    client.close();
    Figures f;
    f.perSecond = count * 1000.0 / double(ms);
    f.cpuMsPerMessage = cpu / count;
    f.syncsPerMessage = double(syncsAfter - syncsBefore) / count;
    return f;
}

} // namespace

int main(int argc, char **argv) {
    QCoreApplication app(argc, argv);
    QCommandLineParser p;
    p.addHelpOption();
    p.addOption({QStringLiteral("count"), QStringLiteral("messages per round (default 2000)"), QStringLiteral("N"),
                 QStringLiteral("2000")});
    p.addOption({QStringLiteral("members"), QStringLiteral("group members (default 500)"), QStringLiteral("M"),
                 QStringLiteral("500")});
    p.addOption({QStringLiteral("rounds"), QStringLiteral("rounds per mode, alternated (default 3)"),
                 QStringLiteral("R"), QStringLiteral("3")});
    p.addOption({QStringLiteral("interval"),
                 QStringLiteral("ms between two messages (default 0: a burst, as fast as the server can)"),
                 QStringLiteral("MS"), QStringLiteral("0")});
    p.addOption({QStringLiteral("dir"), QStringLiteral("folder for the stores (default: a temporary one)"),
                 QStringLiteral("DIR")});
    p.process(app);
    const int count = std::max(1, p.value(QStringLiteral("count")).toInt());
    const int members = std::max(2, p.value(QStringLiteral("members")).toInt());
    const int rounds = std::max(1, p.value(QStringLiteral("rounds")).toInt());
    const int intervalMs = std::max(0, p.value(QStringLiteral("interval")).toInt());
    QTemporaryDir tmp;
    const QString dir = p.isSet(QStringLiteral("dir")) ? p.value(QStringLiteral("dir")) : tmp.path();

    QThread serverThread;
    serverThread.start();
    auto *server = new FakeServer;
    server->moveToThread(&serverThread);
    const QString conv = QStringLiteral("big");
    bool listening = false;
    QMetaObject::invokeMethod(server, [&] {
        QStringList list{QStringLiteral("ana"), QStringLiteral("ben")};
        for (int i = 2; i < members; ++i)
            list << QStringLiteral("user%1").arg(i);
        server->createConv(conv, list);
        server->append(conv, QStringLiteral("ben"), QStringLiteral("first"));
        listening = server->listen();
    }, Qt::BlockingQueuedConnection);
    if (!listening)
        qFatal("the fake server does not listen");

    std::printf("bench_hints: %d messages per round into a %d-member group, %s, %d rounds per mode (alternated)\n",
                count, members,
                intervalMs > 0 ? qPrintable(QStringLiteral("one every %1 ms").arg(intervalMs)) : "a burst", rounds);
    Figures hint, event;
    for (int r = 0; r < rounds; ++r) {
        for (const bool h : {false, true}) {
            const Figures f = round(server, dir, conv, count, h, r, intervalMs);
            std::printf("  round %d %-5s %8.0f msg/s  %.3f CPU ms/msg on the client thread  %.3f syncs/msg\n", r + 1,
                        h ? "hint" : "event", f.perSecond, f.cpuMsPerMessage, f.syncsPerMessage);
            Figures &sum = h ? hint : event;
            sum.perSecond += f.perSecond / rounds;
            sum.cpuMsPerMessage += f.cpuMsPerMessage / rounds;
            sum.syncsPerMessage += f.syncsPerMessage / rounds;
        }
    }
    std::printf("event pushes (baseline): %8.0f msg/s  %.3f CPU ms/msg\n", event.perSecond, event.cpuMsPerMessage);
    std::printf("hints (> push_full_max): %8.0f msg/s  %.3f CPU ms/msg  %.3f syncs/msg\n", hint.perSecond,
                hint.cpuMsPerMessage, hint.syncsPerMessage);
    std::printf("ratio hint/event: rate %.2f, CPU per message %.2f\n", hint.perSecond / event.perSecond,
                hint.cpuMsPerMessage / event.cpuMsPerMessage);
    QMetaObject::invokeMethod(server, [server] { server->stop(); delete server; }, Qt::BlockingQueuedConnection);
    serverThread.quit();
    serverThread.wait();
    return 0;
}
