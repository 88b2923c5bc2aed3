// qmlchat: the QML example of the SDK. C++ only reads the command line (and
// the demo token file, which QML cannot read); everything else is QML on
// `import ImSdk` (ChatView.qml).
//   qmlchat [--server URL] [--token TOKEN | --token-file FILE [--user NAME]] [--data-dir DIR]
#include <QtCore/QCommandLineParser>
#include <QtCore/QDir>
#include <QtCore/QFile>
#include <QtCore/QJsonArray>
#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>
#include <QtCore/QStandardPaths>
#include <QtGui/QGuiApplication>
#include <QtQml/QQmlApplicationEngine>

#include <cstdio>

int main(int argc, char *argv[]) {
    QGuiApplication app(argc, argv);
    QCoreApplication::setApplicationName(QStringLiteral("qmlchat"));
    QCoreApplication::setOrganizationName(QStringLiteral("ImChat"));

    QCommandLineParser cli;
    cli.setApplicationDescription(QStringLiteral("ImChat QML example (import ImSdk)"));
    cli.addHelpOption();
    const QCommandLineOption server(QStringLiteral("server"), QStringLiteral("Server URL ws://HOST:PORT/v1/ws."),
                                    QStringLiteral("URL"));
    const QCommandLineOption token(QStringLiteral("token"), QStringLiteral("Device token."), QStringLiteral("TOKEN"));
    const QCommandLineOption tokenFile(QStringLiteral("token-file"),
                                       QStringLiteral("JSON written by `imserver admin demo` (users and tokens)."),
                                       QStringLiteral("FILE"));
    const QCommandLineOption user(QStringLiteral("user"), QStringLiteral("Preselect this user of the token file."),
                                  QStringLiteral("NAME"));
    const QCommandLineOption dataDir(QStringLiteral("data-dir"),
                                     QStringLiteral("Folder of the local databases (default: the app data folder)."),
                                     QStringLiteral("DIR"));
    cli.addOptions({server, token, tokenFile, user, dataDir});
    cli.process(app);

    auto fail = [](const QString &msg) {
        std::fprintf(stderr, "qmlchat: %s\n", qPrintable(msg));
        return 2;
    };

    // The demo token file: {"server": URL, "users": [{"user", "device", "token"}, ...]}.
    QString serverUrl = cli.value(server);
    QVariantList users;
    if (cli.isSet(tokenFile)) {
        QFile f(cli.value(tokenFile));
        if (!f.open(QIODevice::ReadOnly))
            return fail(QStringLiteral("cannot read %1").arg(f.fileName()));
        const QJsonObject o = QJsonDocument::fromJson(f.readAll()).object();
        for (const QJsonValue &u : o.value(QStringLiteral("users")).toArray())
            users.append(u.toObject().toVariantMap());
        if (users.isEmpty())
            return fail(QStringLiteral("%1 lists no users").arg(f.fileName()));
        if (serverUrl.isEmpty())
            serverUrl = o.value(QStringLiteral("server")).toString();
    }

    // The SDK opens a database file; its folder must exist.
    const QString data = cli.isSet(dataDir) ? cli.value(dataDir)
                                            : QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
    if (!QDir().mkpath(data))
        return fail(QStringLiteral("cannot create the data folder %1").arg(data));

    QQmlApplicationEngine engine;
    // Uninstalled, `import ImSdk` lies in the build tree's QML folder
    // (build/qml), compiled in relative to this executable's folder; installed
    // (qml6-module-imsdk), in Qt's QML folder, which the engine searches anyway.
    const QDir exeDir(QCoreApplication::applicationDirPath());
    engine.addImportPath(QDir::cleanPath(exeDir.absoluteFilePath(QStringLiteral(IM_QML_IMPORT_DIR))));
    engine.setInitialProperties({{QStringLiteral("serverUrl"), serverUrl},
                                 {QStringLiteral("token"), cli.value(token)},
                                 {QStringLiteral("users"), users},
                                 {QStringLiteral("user"), cli.value(user)},
                                 {QStringLiteral("dataDir"), data}});
    QObject::connect(&engine, &QQmlApplicationEngine::objectCreationFailed, &app,
                     [] { QCoreApplication::exit(1); }, Qt::QueuedConnection);
    engine.load(QUrl(QStringLiteral("qrc:/QmlChat/Main.qml")));
    return app.exec();
}
