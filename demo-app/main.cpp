// imdemo: the Qt Widgets demo chat app for QA (see docs/demo-app.md).
//   imdemo --server ws://127.0.0.1:8080/v1/ws --token-file var/demo-tokens.json --user ana
#include "chatwindow.h"
#include "windowmanager.h"

#include <QtCore/QCommandLineParser>
#include <QtCore/QDir>
#include <QtCore/QStandardPaths>
#include <QtWidgets/QApplication>

#include <cstdio>

int main(int argc, char **argv) {
    QApplication app(argc, argv);
    QApplication::setApplicationName(QStringLiteral("imdemo"));
    QApplication::setOrganizationName(QStringLiteral("imchat"));

    QCommandLineParser cli;
    cli.setApplicationDescription(QStringLiteral("Demo chat app for QA: every behaviour of the messaging contract, "
                                                 "visible and provokable."));
    cli.addHelpOption();
    const QCommandLineOption server(QStringLiteral("server"),
                                    QStringLiteral("Server URL ws://HOST:PORT/v1/ws (repeatable: failover order)."),
                                    QStringLiteral("URL"));
    const QCommandLineOption tokenFile(QStringLiteral("token-file"),
                                       QStringLiteral("JSON written by `imserver admin demo` (users and tokens)."),
                                       QStringLiteral("FILE"));
    const QCommandLineOption user(QStringLiteral("user"),
                                  QStringLiteral("Sign in as this user (or device) of the token file."),
                                  QStringLiteral("NAME"));
    const QCommandLineOption token(QStringLiteral("token"), QStringLiteral("Sign in with this device token."),
                                   QStringLiteral("TOKEN"));
    const QCommandLineOption db(QStringLiteral("db"),
                                QStringLiteral("SQLite file of the first window (default: <data-dir>/<user>.db)."),
                                QStringLiteral("PATH"));
    const QCommandLineOption dataDir(QStringLiteral("data-dir"),
                                     QStringLiteral("Directory of the per-user databases (default: the app data dir)."),
                                     QStringLiteral("DIR"));
    const QCommandLineOption caFile(QStringLiteral("ca-file"),
                                    QStringLiteral("wss://: trust only the CA(s) in this PEM file, instead of the "
                                                   "system store (a pin still works beside it)."),
                                    QStringLiteral("PEM"));
    const QCommandLineOption pin(QStringLiteral("pin-sha256"),
                                 QStringLiteral("wss://: accept only the server certificate with this SHA-256 "
                                                "fingerprint (as `openssl x509 -noout -fingerprint -sha256` prints it)."),
                                 QStringLiteral("HEX"));
    cli.addOptions({server, tokenFile, user, token, db, dataDir, caFile, pin});
    cli.process(app);

    auto fail = [](const QString &msg) {
        std::fprintf(stderr, "imdemo: %s\n", qPrintable(msg));
        return 2;
    };

    AppOptions opts;
    if (cli.isSet(tokenFile)) {
        QString err;
        if (!opts.tokens.load(cli.value(tokenFile), &err))
            return fail(err);
    }
    QString bad;
    opts.servers = parseServerList(cli.values(server).join(QLatin1Char('\n')), &bad);
    if (!bad.isEmpty())
        return fail(QStringLiteral("--server %1 is not a ws:// or wss:// URL").arg(bad));
    opts.caFile = cli.value(caFile);
    opts.pinSha256 = cli.value(pin);
    const QString tlsProblem = checkTlsSettings(opts.caFile, opts.pinSha256);
    if (!tlsProblem.isEmpty())
        return fail(tlsProblem);
    opts.dataDir = cli.isSet(dataDir) ? cli.value(dataDir)
                                      : QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
    if (!QDir().mkpath(opts.dataDir))
        return fail(QStringLiteral("cannot create data dir %1").arg(opts.dataDir));

    WindowManager windows(opts);
    if (cli.isSet(token) || cli.isSet(user)) {
        Session s;
        if (cli.isSet(token)) {
            s.token = cli.value(token);
        } else {
            const DemoUser *u = opts.tokens.find(cli.value(user));
            if (!u)
                return fail(opts.tokens.path.isEmpty()
                                ? QStringLiteral("--user needs --token-file")
                                : QStringLiteral("user %1 is not in %2").arg(cli.value(user), opts.tokens.path));
            s.token = u->token;
            s.user = u->user;
            s.device = u->device;
        }
        s.dbPath = cli.value(db);
        windows.openWindow(s);
    } else {
        SignInDialog *dialog = windows.showSignIn(nullptr);
        dialog->setDatabasePath(cli.value(db));
        dialog->setTlsSettings(opts.caFile, opts.pinSha256);
        QObject::connect(dialog, &QDialog::rejected, &app, &QCoreApplication::quit);
    }
    return app.exec();
}
