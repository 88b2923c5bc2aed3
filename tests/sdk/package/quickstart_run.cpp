// sdk.package_consumer, second half: runs the quick start (`mychat`, built
// against the installed package) against the real server on a clean machine:
// a fresh HOME and XDG_DATA_HOME (the app's data folder does not exist), the
// demo user ana's token. The quick start exits 0 once its message is Sent
// (the server committed it); this runner then checks the server's side: ben
// syncs "team" and sees "hello" from ana.
//
//   quickstart_run MYCHAT_BINARY
#include "exerelative.h"
#include "realserver.h"

#include <im/client.h>
#include <im/messagelistmodel.h>

#include <QtCore/QCoreApplication>
#include <QtCore/QProcess>
#include <QtCore/QTemporaryDir>

#include <cstdio>

int main(int argc, char **argv) {
    QCoreApplication app(argc, argv);
    if (app.arguments().size() != 2) {
        std::fprintf(stderr, "usage: quickstart_run MYCHAT_BINARY\n");
        return 2;
    }
    RealServer server(exeRelativePath(IM_SERVER_BIN));
    const QString error = server.start();
    if (!error.isEmpty()) {
        std::fprintf(stderr, "real server: %s\n", qPrintable(error));
        return 1;
    }
    QTemporaryDir home;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("HOME"), home.filePath(QStringLiteral("home")));
    env.insert(QStringLiteral("XDG_DATA_HOME"), home.filePath(QStringLiteral("home/.local/share")));
    env.insert(QStringLiteral("IM_SERVER"), server.url.toString());
    env.insert(QStringLiteral("IM_TOKEN"), server.tokens.value(QStringLiteral("ana")));
    env.insert(QStringLiteral("IM_USER"), QStringLiteral("ana"));
    QProcess mychat;
    mychat.setProcessEnvironment(env);
    mychat.setProcessChannelMode(QProcess::MergedChannels);
    mychat.start(app.arguments().at(1), {});
    if (!mychat.waitForFinished(120000) || mychat.exitStatus() != QProcess::NormalExit || mychat.exitCode() != 0) {
        std::fprintf(stderr, "the quick start did not finish with its message Sent (exit %d):\n%s\n",
                     mychat.exitCode(), mychat.readAll().constData());
        mychat.kill();
        mychat.waitForFinished();
        return 1;
    }
    std::printf("quick start output:\n%s", mychat.readAll().constData());

    im::Client ben;
    ben.setServers({server.url});
    ben.setCredentials(server.tokens.value(QStringLiteral("ben")));
    if (!ben.open(home.filePath(QStringLiteral("ben/chat.db")))) {
        std::fprintf(stderr, "ben: %s\n", qPrintable(ben.lastError()));
        return 1;
    }
    bool synced = false;
    QObject::connect(&ben, &im::Client::conversationSynced, [&](const QString &c) { synced |= c == u"team"; });
    ben.connectToServer();
    if (!QTest::qWaitFor([&] { return synced; }, 60000)) {
        std::fprintf(stderr, "ben never synced team\n");
        return 1;
    }
    im::MessageListModel team(&ben, QStringLiteral("team"));
    team.refresh();
    int hellos = 0;
    for (int r = 0; r < team.count(); ++r)
        if (team.get(r, im::MessageListModel::BodyRole).toString() == u"hello"
            && team.get(r, im::MessageListModel::SenderRole).toString() == u"ana")
            ++hellos;
    if (hellos != 1) {
        std::fprintf(stderr, "ben sees %d 'hello' from ana in team (expected 1)\n", hellos);
        return 1;
    }
    std::printf("the quick start ran against the real server: ben sees its message once\n");
    return 0;
}
