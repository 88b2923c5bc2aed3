// The quick start of docs/sdk.md, built by ctest (sdk.package_consumer)
// against an installed ImSdk, exactly as an outside app would.
#include <im/client.h>
#include <im/messagelistmodel.h>
#include <QCoreApplication>
#include <QStandardPaths>

int main(int argc, char **argv) {
    QCoreApplication app(argc, argv);
    im::Client client;
    client.setServers({QUrl("ws://127.0.0.1:8080/v1/ws")});
    client.setCredentials(qEnvironmentVariable("IM_TOKEN"));   // from `imserver admin ... device add`
    const QString dir = QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
    if (!client.open(dir + "/chat.db"))                      // creates/migrates the local database
        qFatal("%s", qPrintable(client.lastError()));
    QObject::connect(&client, &im::Client::messageStateChanged,
                     [](const QString &conv, const QString &cmid, qint64 seq, im::MessageState st, const QString &err) {
                         qInfo() << conv << cmid << seq << st << err;
                     });
    QObject::connect(&client, &im::Client::errorOccurred,
                     [](const QString &code, const QString &msg) { qWarning() << code << msg; });
    im::MessageListModel timeline(&client, "team");          // hand this to a QListView / ListView
    client.connectToServer();                                // asynchronous, reconnects by itself
    client.send("team", "hello");                            // durable before it returns
    return app.exec();
}
