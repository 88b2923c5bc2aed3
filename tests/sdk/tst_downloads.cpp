// Files received (obligation 17, issue 50; docs/sdk.md "Receiving files"):
// Client::download() against the real imserver and PostgreSQL, through a
// TCP proxy on 127.0.0.1 that counts the attachment bytes it forwards and
// can cut or stall a transfer. Real SQLite stores in a QTemporaryDir.
// Demo data: users ana, ben, cy; group "team".
#include "exerelative.h"
#include "realclient.h"
#include "realserver.h"

#include <im/client.h>
#include <im/messagelistmodel.h>

#include <QtCore/QCryptographicHash>
#include <QtCore/QRandomGenerator>
#include <QtCore/QTemporaryDir>
#include <QtCore/QUuid>
#include <QtNetwork/QNetworkAccessManager>
#include <QtNetwork/QNetworkReply>
#include <QtNetwork/QTcpServer>
#include <QtNetwork/QTcpSocket>
#include <QtTest/QtTest>
#include <QtWebSockets/QWebSocket>

#include <algorithm>
#include <memory>

using im::Client;

namespace {

// Forwards every connection to the server. Attachment requests (GET
// /v1/attachments/...) are recorded, and the bytes the server sends back on
// them counted (headers included); with a budget set, the next attachment
// answer is cut (connection aborted) or stalled (no more bytes, the
// connection kept open) after that many bytes.
class Proxy : public QObject {
public:
    enum class Mode { Cut, Stall };
    explicit Proxy(quint16 upstream) : upstream_(upstream) {
        server_.listen(QHostAddress::LocalHost, 0);
        connect(&server_, &QTcpServer::newConnection, this, [this] {
            while (QTcpSocket *c = server_.nextPendingConnection())
                pipe(c);
        });
    }
    QUrl wsUrl() const { return QUrl(QStringLiteral("ws://127.0.0.1:%1/v1/ws").arg(server_.serverPort())); }
    void limitNext(qint64 bytes, Mode mode) { budget_ = bytes; mode_ = mode; }

    QList<QByteArray> requests; // the attachment requests' heads, in order
    qint64 attachmentBytes = 0; // server -> client on attachment answers
    /// While true, one byte of every piece of an attachment answer's body
    /// that passes is flipped (the last of the piece; a piece that ends
    /// the head, "\r\n\r\n", is left alone): bad bytes on the wire.
    bool corruptAttachments = false;

private:
    void pipe(QTcpSocket *c) {
        auto *u = new QTcpSocket(c);
        auto att = std::make_shared<bool>(false);
        connect(c, &QTcpSocket::readyRead, u, [this, c, u, att] {
            const QByteArray data = c->readAll();
            if (data.startsWith("GET /v1/attachments/")) {
                *att = true;
                requests.append(data);
            } else if (data.startsWith("GET ") || data.startsWith("POST ") || data.startsWith("PUT ")) {
                *att = false;
            }
            u->write(data); // buffered until connected
        });
        connect(u, &QTcpSocket::readyRead, c, [this, c, u, att] {
            QByteArray data = u->readAll();
            if (*att && budget_ >= 0) {
                if (data.size() >= budget_) {
                    data.truncate(budget_);
                    budget_ = -1;
                    c->write(data);
                    attachmentBytes += data.size();
                    c->flush();
                    if (mode_ == Mode::Cut) {
                        c->abort();
                        u->abort();
                    } else {
                        u->disconnect(c); // stalled: nothing more goes to c
                    }
                    return;
                }
                budget_ -= data.size();
            }
            if (*att)
                attachmentBytes += data.size();
            if (*att && corruptAttachments && !data.isEmpty() && !data.endsWith("\r\n\r\n"))
                data.back() = char(data.back() ^ 0x20);
            c->write(data);
        });
        connect(c, &QTcpSocket::disconnected, u, [u] { u->disconnectFromHost(); });
        connect(u, &QTcpSocket::disconnected, c, [c] { c->disconnectFromHost(); });
        connect(c, &QTcpSocket::disconnected, c, &QObject::deleteLater);
        u->connectToHost(QHostAddress::LocalHost, upstream_);
    }

    quint16 upstream_;
    QTcpServer server_;
    qint64 budget_ = -1;
    Mode mode_ = Mode::Cut;
};

QByteArray randomBytes(qsizetype n) {
    QByteArray b(n, Qt::Uninitialized);
    QRandomGenerator::global()->fillRange(reinterpret_cast<quint32 *>(b.data()), n / 4);
    return b;
}

QByteArray fileBytes(const QString &path) {
    QFile f(path);
    return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

} // namespace

class TestDownloads : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void cleanupTestCase() { server_.reset(); }

    void a_download_arrives_whole_and_checked();
    void an_attachment_name_is_searchable();
    void a_dropped_download_resumes_with_range();
    void a_restarted_client_resumes_its_partial_file();
    void a_corrupted_partial_file_is_detected_and_fetched_again();
    void bytes_damaged_on_every_transfer_fail_typed_digest_mismatch();
    void the_cache_is_bounded_and_serves_repeats();
    void a_sent_file_shows_its_upload_and_arrives_for_the_reader();

private:
    struct Sent { QString attId; qint64 seq = 0; QByteArray bytes; };
    // ben uploads `bytes` as `name` and sends it to team with `body`.
    Sent sendFile(const QString &name, const QByteArray &bytes, const QString &body);
    QString upload(const QString &user, const QString &name, const QByteArray &bytes);
    qint64 sendWithAttachment(const QString &user, const QString &conv, const QString &body, const QString &attId);
    // ana's client through the proxy, synced up to `seq` of team (0: no wait).
    std::unique_ptr<Client> ana(const QString &store, qint64 seq);
    // Downloads and waits; empty on success, else the failure.
    QString fetch(Client &c, const QString &attId, const QString &path, int timeoutMs = 60000);
    QUrl http(const QString &path) const {
        QUrl u = server_->url;
        u.setScheme(QStringLiteral("http"));
        u.setPath(path);
        return u;
    }
    QString partialOf(const QString &store, const QString &attId) const {
        return store + QStringLiteral(".cache/partial/") + QString::fromLatin1(QUrl::toPercentEncoding(attId))
               + QStringLiteral(".part");
    }

    std::unique_ptr<RealServer> server_;
    std::unique_ptr<Proxy> proxy_;
    QTemporaryDir dir_;
    QNetworkAccessManager nam_;
};

void TestDownloads::initTestCase() {
    QVERIFY(dir_.isValid());
    server_ = std::make_unique<RealServer>(exeRelativePath(IM_SERVER_BIN));
    const QString error = server_->start();
    QVERIFY2(error.isEmpty(), qPrintable(error));
    proxy_ = std::make_unique<Proxy>(quint16(server_->url.port()));
}

QString TestDownloads::upload(const QString &user, const QString &name, const QByteArray &bytes) {
    const QByteArray auth = "Bearer " + server_->tokens.value(user).toUtf8();
    QNetworkRequest start(http(QStringLiteral("/v1/uploads")));
    start.setRawHeader("Authorization", auth);
    start.setHeader(QNetworkRequest::ContentTypeHeader, QStringLiteral("application/json"));
    const QJsonObject spec{{QStringLiteral("name"), name},
                           {QStringLiteral("mime"), QStringLiteral("application/octet-stream")},
                           {QStringLiteral("size"), qint64(bytes.size())},
                           {QStringLiteral("sha256"), QString::fromLatin1(QCryptographicHash::hash(bytes, QCryptographicHash::Sha256).toHex())}};
    std::unique_ptr<QNetworkReply> r(nam_.post(start, QJsonDocument(spec).toJson(QJsonDocument::Compact)));
    if (!QTest::qWaitFor([&] { return r->isFinished(); }, 30000) || r->error() != QNetworkReply::NoError)
        return {};
    const QString att = QJsonDocument::fromJson(r->readAll()).object().value(QStringLiteral("att_id")).toString();
    QNetworkRequest put(http(QStringLiteral("/v1/uploads/") + att));
    QUrl u = put.url();
    u.setQuery(QStringLiteral("offset=0"));
    put.setUrl(u);
    put.setRawHeader("Authorization", auth);
    put.setHeader(QNetworkRequest::ContentTypeHeader, QStringLiteral("application/octet-stream"));
    r.reset(nam_.put(put, bytes));
    if (!QTest::qWaitFor([&] { return r->isFinished(); }, 60000) || r->error() != QNetworkReply::NoError)
        return {};
    return QJsonDocument::fromJson(r->readAll()).object().value(QStringLiteral("complete")).toBool() ? att : QString();
}

qint64 TestDownloads::sendWithAttachment(const QString &user, const QString &conv, const QString &body,
                                         const QString &attId) {
    // The wire's `send` with `attachments` (contract section 12), as any
    // sender's client writes it.
    QWebSocket ws;
    QList<QJsonObject> frames;
    connect(&ws, &QWebSocket::textMessageReceived, &ws,
            [&](const QString &t) { frames.append(QJsonDocument::fromJson(t.toUtf8()).object()); });
    ws.open(server_->url);
    if (!QTest::qWaitFor([&] { return ws.state() == QAbstractSocket::ConnectedState; }, 10000))
        return 0;
    auto answer = [&](const QString &rid) -> QJsonObject {
        QJsonObject found;
        (void)QTest::qWaitFor([&] {
            for (const QJsonObject &f : std::as_const(frames))
                if (f.value(QStringLiteral("rid")).toString() == rid)
                    return (found = f), true;
            return false;
        }, 10000);
        return found;
    };
    ws.sendTextMessage(QString::fromUtf8(QJsonDocument(QJsonObject{
        {QStringLiteral("t"), QStringLiteral("hello")}, {QStringLiteral("rid"), QStringLiteral("h")},
        {QStringLiteral("token"), server_->tokens.value(user)},
        {QStringLiteral("install"), QUuid::createUuid().toString(QUuid::WithoutBraces)}}).toJson(QJsonDocument::Compact)));
    if (answer(QStringLiteral("h")).value(QStringLiteral("t")).toString() != u"welcome")
        return 0;
    ws.sendTextMessage(QString::fromUtf8(QJsonDocument(QJsonObject{
        {QStringLiteral("t"), QStringLiteral("send")}, {QStringLiteral("rid"), QStringLiteral("s")},
        {QStringLiteral("conv"), conv}, {QStringLiteral("cmid"), QUuid::createUuid().toString(QUuid::WithoutBraces)},
        {QStringLiteral("body"), body}, {QStringLiteral("attachments"), QJsonArray{attId}}}).toJson(QJsonDocument::Compact)));
    const QJsonObject sent = answer(QStringLiteral("s"));
    if (sent.value(QStringLiteral("t")).toString() != u"sent")
        qWarning("send answered %s", QJsonDocument(sent).toJson().constData());
    return sent.value(QStringLiteral("seq")).toInteger();
}

TestDownloads::Sent TestDownloads::sendFile(const QString &name, const QByteArray &bytes, const QString &body) {
    Sent s;
    s.bytes = bytes;
    s.attId = upload(QStringLiteral("ben"), name, bytes);
    if (!s.attId.isEmpty())
        s.seq = sendWithAttachment(QStringLiteral("ben"), QStringLiteral("team"), body, s.attId);
    return s;
}

std::unique_ptr<Client> TestDownloads::ana(const QString &store, qint64 seq) {
    auto c = makeRealClient(*server_, QStringLiteral("ana"), dir_.filePath(store));
    c->setServers({proxy_->wsUrl()});
    qint64 upTo = 0;
    connect(c.get(), &Client::eventsApplied, c.get(), [&upTo](const QString &conv, qint64, qint64 to) {
        if (conv == u"team")
            upTo = std::max(upTo, to);
    });
    c->connectToServer();
    if (!QTest::qWaitFor([&] { return upTo >= seq; }, 30000))
        qWarning("team not synced to %lld (at %lld)", seq, upTo);
    c->disconnect(c.get());
    return c;
}

QString TestDownloads::fetch(Client &c, const QString &attId, const QString &path, int timeoutMs) {
    QSignalSpy done(&c, &Client::downloadFinished);
    QSignalSpy failed(&c, &Client::downloadFailed);
    if (c.download(attId, path) != attId)
        return QStringLiteral("download() refused: ") + c.lastError();
    if (!QTest::qWaitFor([&] { return !done.isEmpty() || !failed.isEmpty(); }, timeoutMs))
        return QStringLiteral("no answer");
    if (!failed.isEmpty())
        return failed.first().at(2).toString() + u' ' + failed.first().at(3).toString();
    return done.first().at(1).toString() == path ? QString() : QStringLiteral("finished at another path");
}

void TestDownloads::a_download_arrives_whole_and_checked() {
    const Sent s = sendFile(QStringLiteral("whole.bin"), randomBytes(3 * 1024 * 1024 + 5), QStringLiteral("whole"));
    QVERIFY(s.seq > 0);
    auto c = ana(QStringLiteral("whole.db"), s.seq);
    // The timeline shows the file (MessageListModel's attachments role).
    im::MessageListModel model(c.get(), QStringLiteral("team"));
    auto rowOf = [&] {
        for (int i = 0; i < model.rowCount(); ++i)
            if (model.get(i, QStringLiteral("seq")).toLongLong() == s.seq)
                return i;
        return -1;
    };
    QTRY_VERIFY(rowOf() >= 0);
    auto file = [&] { return model.get(rowOf(), QStringLiteral("attachments")).toList().value(0).toMap(); };
    QCOMPARE(model.get(rowOf(), QStringLiteral("attachments")).toList().size(), 1);
    QCOMPARE(file().value(QStringLiteral("id")).toString(), s.attId);
    QCOMPARE(file().value(QStringLiteral("name")).toString(), QStringLiteral("whole.bin"));
    QCOMPARE(file().value(QStringLiteral("size")).toLongLong(), qint64(s.bytes.size()));
    QCOMPARE(file().value(QStringLiteral("downloadState")).toString(), QString());
    QSignalSpy progress(c.get(), &Client::downloadProgress);
    const QString out = dir_.filePath(QStringLiteral("whole.out"));
    const QString failure = fetch(*c, s.attId, out);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(fileBytes(out), s.bytes);
    QCOMPARE(file().value(QStringLiteral("downloadState")).toString(), QStringLiteral("done"));
    QCOMPARE(file().value(QStringLiteral("path")).toString(), out);
    QVERIFY(!progress.isEmpty());
    QCOMPARE(progress.last().at(1).toLongLong(), qint64(s.bytes.size()));
    QCOMPARE(progress.last().at(2).toLongLong(), qint64(s.bytes.size()));
    // Unknown and not visible alike: NOT_FOUND, and no file.
    const QString missing = dir_.filePath(QStringLiteral("missing.out"));
    QCOMPARE(fetch(*c, QStringLiteral("no-such-attachment"), missing).section(u' ', 0, 0), QStringLiteral("NOT_FOUND"));
    QVERIFY(!QFile::exists(missing));
    // Bad input is refused at once.
    QVERIFY(c->download(QStringLiteral("bad/id"), out).isEmpty());
    QVERIFY(c->download(s.attId, dir_.filePath(QStringLiteral("no-such-folder/x"))).isEmpty());
}

void TestDownloads::an_attachment_name_is_searchable() {
    const Sent s = sendFile(QStringLiteral("quarterly-figures.xlsx"), randomBytes(1024), QString());
    QVERIFY(s.seq > 0);
    auto c = ana(QStringLiteral("search.db"), s.seq);
    QSignalSpy answers(c.get(), &Client::searchFinished);
    const int id = c->search(QStringLiteral("quarterly"), QStringLiteral("team"));
    QTRY_VERIFY_WITH_TIMEOUT(!answers.isEmpty(), 20000);
    QCOMPARE(answers.first().at(0).toInt(), id);
    const auto results = answers.first().at(1).value<QList<im::SearchResult>>();
    QCOMPARE(results.size(), 1);
    QCOMPARE(results.first().seq(), s.seq);
}

void TestDownloads::a_dropped_download_resumes_with_range() {
    const Sent s = sendFile(QStringLiteral("drop.bin"), randomBytes(4 * 1024 * 1024), QStringLiteral("drop"));
    QVERIFY(s.seq > 0);
    auto c = ana(QStringLiteral("drop.db"), s.seq);
    const qsizetype before = proxy_->requests.size();
    const qint64 bytesBefore = proxy_->attachmentBytes;
    proxy_->limitNext(1024 * 1024, Proxy::Mode::Cut);
    const QString out = dir_.filePath(QStringLiteral("drop.out"));
    const QString failure = fetch(*c, s.attId, out);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(fileBytes(out), s.bytes);
    // Two requests: the whole file, then the rest of it from where the
    // drop left the partial file.
    const QList<QByteArray> reqs = proxy_->requests.mid(before);
    QCOMPARE(reqs.size(), 2);
    QVERIFY(!reqs.at(0).contains("Range:"));
    const QRegularExpression range(QStringLiteral("Range: bytes=(\\d+)-\\r\\n"));
    const auto m = range.match(QString::fromLatin1(reqs.at(1)));
    QVERIFY2(m.hasMatch(), reqs.at(1).constData());
    QVERIFY(m.captured(1).toLongLong() > 512 * 1024);
    QVERIFY(reqs.at(1).contains("If-Range: \""));
    // Bytes fetched again: only the answers' headers (under 2 KiB).
    const qint64 forwarded = proxy_->attachmentBytes - bytesBefore;
    QVERIFY2(forwarded - s.bytes.size() < 2048, qPrintable(QString::number(forwarded - s.bytes.size())));
}

void TestDownloads::a_restarted_client_resumes_its_partial_file() {
    const Sent s = sendFile(QStringLiteral("restart.bin"), randomBytes(4 * 1024 * 1024), QStringLiteral("restart"));
    QVERIFY(s.seq > 0);
    const QString store = dir_.filePath(QStringLiteral("restart.db"));
    qint64 partial = 0;
    {
        auto c = ana(QStringLiteral("restart.db"), s.seq);
        proxy_->limitNext(1024 * 1024, Proxy::Mode::Stall);
        qint64 received = 0;
        connect(c.get(), &Client::downloadProgress, c.get(), [&](const QString &, qint64 r, qint64) { received = r; });
        QCOMPARE(c->download(s.attId, dir_.filePath(QStringLiteral("restart.out"))), s.attId);
        QTRY_VERIFY_WITH_TIMEOUT(received > 1000 * 1000, 30000);
        partial = received;
    } // the app quits mid-download
    QCOMPARE(QFileInfo(partialOf(store, s.attId)).size(), partial);
    const qsizetype before = proxy_->requests.size();
    const qint64 bytesBefore = proxy_->attachmentBytes;
    auto c = ana(QStringLiteral("restart.db"), 0); // synced already
    QSignalSpy progress(c.get(), &Client::downloadProgress);
    const QString out = dir_.filePath(QStringLiteral("restart.out"));
    const QString failure = fetch(*c, s.attId, out);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(fileBytes(out), s.bytes);
    const QList<QByteArray> reqs = proxy_->requests.mid(before);
    QCOMPARE(reqs.size(), 1);
    QVERIFY2(reqs.at(0).contains("Range: bytes=" + QByteArray::number(partial) + "-"), reqs.at(0).constData());
    QVERIFY(progress.first().at(1).toLongLong() > partial); // counted from what it had
    const qint64 forwarded = proxy_->attachmentBytes - bytesBefore;
    QVERIFY2(forwarded < s.bytes.size() - partial + 1024, qPrintable(QString::number(forwarded)));
    QVERIFY(!QFile::exists(partialOf(store, s.attId)));
}

void TestDownloads::a_corrupted_partial_file_is_detected_and_fetched_again() {
    const Sent s = sendFile(QStringLiteral("corrupt.bin"), randomBytes(2 * 1024 * 1024), QStringLiteral("corrupt"));
    QVERIFY(s.seq > 0);
    const QString store = dir_.filePath(QStringLiteral("corrupt.db"));
    {
        auto c = ana(QStringLiteral("corrupt.db"), s.seq);
        proxy_->limitNext(512 * 1024, Proxy::Mode::Stall);
        qint64 received = 0;
        connect(c.get(), &Client::downloadProgress, c.get(), [&](const QString &, qint64 r, qint64) { received = r; });
        QCOMPARE(c->download(s.attId, dir_.filePath(QStringLiteral("corrupt.out"))), s.attId);
        QTRY_VERIFY_WITH_TIMEOUT(received > 500 * 1000, 30000);
    }
    {
        // A byte of the partial file flips on disk.
        QFile f(partialOf(store, s.attId));
        QVERIFY(f.open(QIODevice::ReadWrite));
        QVERIFY(f.seek(1000));
        char b = 0;
        QVERIFY(f.getChar(&b));
        QVERIFY(f.seek(1000));
        QVERIFY(f.putChar(char(b ^ 0x5a)));
    }
    const qsizetype before = proxy_->requests.size();
    auto c = ana(QStringLiteral("corrupt.db"), 0); // synced already
    const QString out = dir_.filePath(QStringLiteral("corrupt.out"));
    const QString failure = fetch(*c, s.attId, out);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(fileBytes(out), s.bytes);
    // The resumed bytes did not add up to the SHA-256: fetched whole again.
    const QList<QByteArray> reqs = proxy_->requests.mid(before);
    QCOMPARE(reqs.size(), 2);
    QVERIFY(reqs.at(0).contains("Range: bytes="));
    QVERIFY(!reqs.at(1).contains("Range:"));
}

// Bad bytes on the wire, every time: the first check fails, the file is
// fetched once more from 0, the second check fails too: downloadFailed with
// the typed Error::DigestMismatch (demo50), and no file at `path`.
void TestDownloads::bytes_damaged_on_every_transfer_fail_typed_digest_mismatch() {
    const Sent s = sendFile(QStringLiteral("damaged.bin"), randomBytes(300 * 1000), QStringLiteral("damaged"));
    QVERIFY(s.seq > 0);
    auto c = ana(QStringLiteral("damaged.db"), s.seq);
    const qsizetype before = proxy_->requests.size();
    proxy_->corruptAttachments = true;
    const auto clean = qScopeGuard([this] { proxy_->corruptAttachments = false; });
    QSignalSpy failed(c.get(), &Client::downloadFailed);
    const QString out = dir_.filePath(QStringLiteral("damaged.out"));
    QCOMPARE(fetch(*c, s.attId, out).section(u' ', 0, 0), QStringLiteral("DIGEST_MISMATCH"));
    QCOMPARE(failed.size(), 1);
    QCOMPARE(failed.at(0).at(0).toString(), s.attId);
    QCOMPARE(failed.at(0).at(1).value<im::Error>(), im::Error::DigestMismatch);
    QCOMPARE(failed.at(0).at(2).toString(), QStringLiteral("DIGEST_MISMATCH"));
    QVERIFY(!QFile::exists(out));
    QCOMPARE(proxy_->requests.size() - before, 2); // once, then once more from 0
    // The proxy's bytes were the damaged ones: clean again, it arrives.
    proxy_->corruptAttachments = false;
    const QString failure = fetch(*c, s.attId, out);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(fileBytes(out), s.bytes);
}

void TestDownloads::the_cache_is_bounded_and_serves_repeats() {
    const qsizetype size = 1024 * 1024;
    const Sent a = sendFile(QStringLiteral("a.bin"), randomBytes(size), QStringLiteral("a"));
    const Sent b = sendFile(QStringLiteral("b.bin"), randomBytes(size), QStringLiteral("b"));
    QVERIFY(a.seq > 0 && b.seq > 0);
    const QString store = dir_.filePath(QStringLiteral("cache.db"));
    auto c = ana(QStringLiteral("cache.db"), b.seq);
    QSignalSpy settings(c.get(), &Client::settingsChanged);
    QCOMPARE(c->downloadCacheSize(), qint64(512) * 1024 * 1024);
    c->setDownloadCacheSize(size + size / 2);
    QCOMPARE(settings.size(), 1);
    const qsizetype start = proxy_->requests.size();
    QString failure = fetch(*c, a.attId, dir_.filePath(QStringLiteral("a1.out")));
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    // Again, to another path: a copy from the cache, nothing fetched.
    failure = fetch(*c, a.attId, dir_.filePath(QStringLiteral("a2.out")));
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(fileBytes(dir_.filePath(QStringLiteral("a2.out"))), a.bytes);
    QCOMPARE(proxy_->requests.size(), start + 1);
    // b does not fit next to a: a, the least recently used, goes.
    failure = fetch(*c, b.attId, dir_.filePath(QStringLiteral("b.out")));
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(proxy_->requests.size(), start + 2);
    const QString cache = store + QStringLiteral(".cache/");
    QVERIFY(!QFile::exists(cache + QString::fromLatin1(QUrl::toPercentEncoding(a.attId))));
    QVERIFY(QFile::exists(cache + QString::fromLatin1(QUrl::toPercentEncoding(b.attId))));
    // a again: fetched again (it was evicted), b evicted in turn.
    failure = fetch(*c, a.attId, dir_.filePath(QStringLiteral("a3.out")));
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(fileBytes(dir_.filePath(QStringLiteral("a3.out"))), a.bytes);
    QCOMPARE(proxy_->requests.size(), start + 3);
    QVERIFY(!QFile::exists(cache + QString::fromLatin1(QUrl::toPercentEncoding(b.attId))));
}

// The round trip with the sending side (sendFile, branch up50): the timeline
// shows our file while it uploads (its name, uploadProgress rising), then as
// sent with its att_id; ben downloads the same bytes.
void TestDownloads::a_sent_file_shows_its_upload_and_arrives_for_the_reader() {
    const QByteArray bytes = randomBytes(2 * 1024 * 1024);
    const QString src = dir_.filePath(QStringLiteral("holiday-photo.jpg"));
    {
        QFile f(src);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(bytes);
    }
    auto c = ana(QStringLiteral("send.db"), 0);
    c->setUploadChunkSize(65536);
    im::MessageListModel model(c.get(), QStringLiteral("team"));
    QList<double> seen;
    connect(&model, &QAbstractItemModel::dataChanged, &model,
            [&](const QModelIndex &from, const QModelIndex &, const QList<int> &roles) {
                if (roles.contains(im::MessageListModel::UploadProgressRole))
                    seen << model.get(from.row(), QStringLiteral("uploadProgress")).toDouble();
            });
    const QString cmid = c->sendFile(QStringLiteral("team"), src, QStringLiteral("look"));
    QVERIFY2(!cmid.isEmpty(), qPrintable(c->lastError()));
    auto rowOf = [&] {
        for (int i = 0; i < model.rowCount(); ++i)
            if (model.get(i, QStringLiteral("cmid")).toString() == cmid)
                return i;
        return -1;
    };
    QVERIFY(rowOf() >= 0); // at once (obligation 1)
    auto file = [&] { return model.get(rowOf(), QStringLiteral("attachments")).toList().value(0).toMap(); };
    QCOMPARE(file().value(QStringLiteral("name")).toString(), QStringLiteral("holiday-photo.jpg"));
    QCOMPARE(file().value(QStringLiteral("size")).toLongLong(), qint64(bytes.size()));
    const double first = model.get(rowOf(), QStringLiteral("uploadProgress")).toDouble();
    QVERIFY2(first >= 0.0 && first < 1.0, qPrintable(QString::number(first)));
    QTRY_VERIFY_WITH_TIMEOUT(model.get(rowOf(), QStringLiteral("seq")).toLongLong() > 0, 60000);
    QCOMPARE(model.get(rowOf(), QStringLiteral("uploadProgress")).toDouble(), -1.0);
    QVERIFY2(std::any_of(seen.cbegin(), seen.cend(), [](double p) { return p > 0.0 && p < 1.0; }),
             qPrintable(QString::number(seen.size())));
    QTRY_VERIFY(!file().value(QStringLiteral("id")).toString().isEmpty());
    const QString attId = file().value(QStringLiteral("id")).toString();
    const qint64 seq = model.get(rowOf(), QStringLiteral("seq")).toLongLong();

    auto ben = makeRealClient(*server_, QStringLiteral("ben"), dir_.filePath(QStringLiteral("ben.db")));
    qint64 upTo = 0;
    connect(ben.get(), &Client::eventsApplied, ben.get(), [&](const QString &conv, qint64, qint64 to) {
        if (conv == u"team")
            upTo = std::max(upTo, to);
    });
    ben->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(upTo >= seq, 30000);
    const QString out = dir_.filePath(QStringLiteral("ben-photo.jpg"));
    const QString failure = fetch(*ben, attId, out);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(fileBytes(out), bytes);
}

QTEST_GUILESS_MAIN(TestDownloads)
#include "tst_downloads.moc"
