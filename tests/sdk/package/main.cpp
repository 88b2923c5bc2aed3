// The quick start of docs/sdk.md, built by ctest (sdk.package_consumer)
// against an installed ImSdk as C++17, exactly as an outside app would, and
// run against the real server (quickstart_run.cpp).
#include <im/client.h>
#include <im/messagelistmodel.h>
#include <QCoreApplication>
#include <QStandardPaths>

int main(int argc, char **argv) {
    QCoreApplication app(argc, argv);
    im::Client client;
    client.setServers({QUrl(qEnvironmentVariable("IM_SERVER", "ws://127.0.0.1:8080/v1/ws"))});
    // Signed in: a user and their token. One store per user (obligation 10):
    // never one chat.db for whoever signs in on this machine.
    const QString user = qEnvironmentVariable("IM_USER");
    client.setCredentials(qEnvironmentVariable("IM_TOKEN"));   // from `imserver admin ... device add`
    const QString dir = QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
    if (!client.open(dir + "/" + QString::fromLatin1(QUrl::toPercentEncoding(user)) + ".db")) // folder, database, lock
        qFatal("%s", qPrintable(client.lastError()));
    QObject::connect(&client, &im::Client::messageStateChanged,
                     [&app](const QString &conv, const QString &cmid, qint64 seq, im::MessageState st, const QString &err) {
                         qInfo() << conv << cmid << seq << st << err;
                         if (st != im::MessageState::Pending)         // settled: this example is done
                             app.exit(st == im::MessageState::Sent ? 0 : 1);
                     });
    QObject::connect(&client, &im::Client::errorOccurred,
                     [](const QString &code, const QString &msg) { qWarning() << code << msg; });
    im::MessageListModel timeline(&client, "team");          // hand this to a QListView / ListView
    client.connectToServer();                                // asynchronous, reconnects by itself
    client.send("team", "hello");                            // durable before it returns
    return app.exec();
}
