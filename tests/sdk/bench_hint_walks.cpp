// Benchmark (issue 48, "a push costs one sync, not a walk of every
// conversation"; figures go to docs/benchmarks.md): a user in N
// conversations (default 1,000) and a group of M members (default 60, above
// push_full_max: hints only), against the real imserver and PostgreSQL.
// Another member sends K messages (default 60) into the group; each reaches
// the user as a `hint`. Counted at the server's /metrics (what an outside
// observer sees): the `convs` requests of the user's first walk (its pages:
// what one walk costs, measured in this run) and those from the first hint
// until the user's client is idle again. Before this change every hint
// scheduled a walk (coalesced over 200 ms): K walks' pages for K hints
// arriving apart. The unread check: the client's badge for the group at
// the end against the server's own count (a walk asked for afterwards).
//
// Exit status 1 if any `convs` request was made during the hints or the
// badge is not the server's count.
//
// --interval MS spaces ben's messages (a group busy at a steady rate, as
// seen from outside); 0 (the default) sends them as fast as he can, so the
// hints arrive in a burst.
//
// Usage: bench_hint_walks [--convs N] [--members M] [--messages K] [--interval MS]
#include "client_p.h"
#include "sdktestutil.h"

#include <im/client.h>

#include <QtCore/QCommandLineParser>
#include <QtCore/QCoreApplication>
#include <QtCore/QElapsedTimer>
#include <QtCore/QSet>
#include <QtCore/QTemporaryDir>
#include <QtTest/QtTest>

#ifdef IM_SERVER_BIN
#include "exerelative.h"
#include "realclient.h"
#include "servermetrics.h"
#endif

#include <cstdio>

int main(int argc, char **argv) {
    QCoreApplication app(argc, argv);
    QCommandLineParser p;
    p.addHelpOption();
    p.addOption({QStringLiteral("convs"), QStringLiteral("the user's other conversations"), QStringLiteral("N"),
                 QStringLiteral("1000")});
    p.addOption({QStringLiteral("members"), QStringLiteral("members of the group"), QStringLiteral("M"),
                 QStringLiteral("60")});
    p.addOption({QStringLiteral("messages"), QStringLiteral("messages into the group"), QStringLiteral("K"),
                 QStringLiteral("60")});
    p.addOption({QStringLiteral("interval"), QStringLiteral("ms between ben's messages"), QStringLiteral("MS"),
                 QStringLiteral("0")});
    p.process(app);
    const int intervalMs = p.value(QStringLiteral("interval")).toInt();
#ifndef IM_SERVER_BIN
    std::printf("bench_hint_walks: imserver is not part of this build\n");
    return 0;
#else
    const int nConvs = p.value(QStringLiteral("convs")).toInt();
    const int members = std::max(2, p.value(QStringLiteral("members")).toInt());
    const int messages = p.value(QStringLiteral("messages")).toInt();
    QElapsedTimer total;
    total.start();
    RealServer server(exeRelativePath(IM_SERVER_BIN));
    if (const QString err = server.start(); !err.isEmpty())
        qFatal("%s", qPrintable(err));
    const QString seedBin = exeRelativePath(IM_SEED_BIN);
    const QString group = QStringLiteral("big");
    for (const QStringList &args :
         {QStringList{QStringLiteral("convs"), QStringLiteral("ana"), QStringLiteral("walk"), QString::number(nConvs)},
          QStringList{QStringLiteral("group"), group, QStringLiteral("member"), QString::number(members - 2),
                      QStringLiteral("ana"), QStringLiteral("ben")}})
        if (const QString err = server.seed(seedBin, args); !err.isEmpty())
            qFatal("%s", qPrintable(err));
    const qint64 setupMs = total.elapsed();

    QTemporaryDir dir;
    // ben first: his own session's walk is over before anything is counted.
    auto ben = makeRealClient(server, QStringLiteral("ben"), dir.filePath(QStringLiteral("ben.db")));
    QSignalSpy benSynced(ben.get(), &im::Client::conversationSynced);
    ben->connectToServer();
    if (!QTest::qWaitFor([&] { return benSynced.contains(QVariantList{group}); }, 120000))
        qFatal("ben never synced the group");
    const im::Sync &benSync = im::ClientPrivate::get(ben.get())->sync;
    const auto idle = [](const im::Sync &s) {
        return !s.convsRefreshPending() && !s.isWalkingConvs() && s.activeSyncs() == 0;
    };
    if (!QTest::qWaitFor([&] { return idle(benSync); }, 120000))
        qFatal("ben never settled");

    // ana's first session: one walk of every conversation (and a sync of
    // each, new to this store).
    const QString anaDb = dir.filePath(QStringLiteral("ana.db"));
    auto ana = makeRealClient(server, QStringLiteral("ana"), anaDb);
    im::Sync &sync = im::ClientPrivate::get(ana.get())->sync;
    QSet<QString> synced;
    QObject::connect(ana.get(), &im::Client::conversationSynced, ana.get(), [&](const QString &c) { synced.insert(c); });
    const qint64 convs0 = serverRequests(server.url, QStringLiteral("convs"));
    QElapsedTimer walk;
    walk.start();
    ana->connectToServer();
    if (!QTest::qWaitFor([&] { return synced.size() >= nConvs + 3 && idle(sync); }, 300000))
        qFatal("ana's first session never settled (%lld conversations synced)", qint64(synced.size()));
    const qint64 firstMs = walk.elapsed();
    const qint64 convs1 = serverRequests(server.url, QStringLiteral("convs"));
    const qint64 pagesPerWalk = convs1 - convs0;
    const auto cursor = [&] {
        return sqlScalar(anaDb, QStringLiteral("SELECT after FROM conversations WHERE conv = ?"), {group}).toLongLong();
    };
    const qint64 start = cursor();

    // The messages: each a hint to ana.
    const quint64 syncs0 = sync.syncRequests();
    QElapsedTimer run;
    run.start();
    for (int i = 0; i < messages; ++i) {
        ben->send(group, QStringLiteral("message %1").arg(i));
        if (intervalMs > 0)
            QTest::qWait(intervalMs);
    }
    if (!QTest::qWaitFor([&] { return cursor() >= start + messages && idle(sync); }, 300000))
        qFatal("ana never caught up (cursor %lld of %lld)", cursor(), start + messages);
    const qint64 runMs = run.elapsed();
    const qint64 convs2 = serverRequests(server.url, QStringLiteral("convs"));
    const qint64 during = convs2 - convs1;
    const qint64 hintSyncs = qint64(sync.syncRequests() - syncs0);

    // The unread check: the badge, then the server's count (a walk now).
    const auto badge = [&] {
        return sqlScalar(anaDb, QStringLiteral("SELECT unread FROM conversations WHERE conv = ?"), {group}).toLongLong();
    };
    const qint64 client = badge();
    sync.requestConvs();
    if (!QTest::qWaitFor([&] { return serverRequests(server.url, QStringLiteral("convs")) > convs2 && idle(sync); },
                         120000))
        qFatal("the check walk never ended");
    const qint64 serverCount = badge();

    std::printf("bench_hint_walks: ana in %d conversations + a %d-member group (hints only), %d messages from ben"
                " (%d ms apart)\n",
                nConvs, members, messages, intervalMs);
    std::printf("  setup (server, seed) %lld ms; ana's first session (walk + %lld syncs) %lld ms\n", setupMs,
                qint64(synced.size()), firstMs);
    std::printf("  one walk of ana's list: %lld convs pages (/metrics)\n", pagesPerWalk);
    std::printf("  convs requests during the %d hints: %lld (a walk per hint, as before: %lld)\n", messages, during,
                pagesPerWalk * messages);
    std::printf("  the %d messages reached ana's store in %lld ms, with %lld sync requests\n", messages, runMs,
                hintSyncs);
    std::printf("  unread: ana's badge %lld, the server's count %lld: %s\n", client, serverCount,
                client == serverCount ? "equal" : "DIFFERENT");
    std::printf("  total %lld ms\n", total.elapsed());
    ana->disconnectFromServer();
    ben->disconnectFromServer();
    return during == 0 && client == serverCount ? 0 : 1;
#endif
}
