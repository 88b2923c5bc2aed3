// im::Client's files (obligation 17): sendFile() copies the file into the
// store's folder and commits its outbox entry; the Outbox and its Uploader
// (upload_p.h) do the rest.
#include "client_p.h"
#include "logging_p.h"

#include <QtCore/QCryptographicHash>
#include <QtCore/QDir>
#include <QtCore/QFile>
#include <QtCore/QFileInfo>
#include <QtCore/QMimeDatabase>
#include <QtCore/QSaveFile>
#include <QtCore/QUuid>

#include <algorithm>

namespace im {

namespace {

// server.md "Attachments": 1-255 bytes of UTF-8 without '/', '\' or
// control characters. Empty if `name` is fine, else why not.
QString checkFileName(const QString &name) {
    const QByteArray utf8 = name.toUtf8();
    if (utf8.isEmpty() || utf8.size() > 255)
        return QStringLiteral("the file name must be 1-255 bytes of UTF-8 (it is %1)").arg(utf8.size());
    if (!name.isValidUtf16())
        return QStringLiteral("the file name is not valid Unicode");
    for (const QChar c : name)
        if (c == u'/' || c == u'\\' || c.category() == QChar::Other_Control)
            return QStringLiteral("the file name contains '/', '\\' or a control character");
    return {};
}

} // namespace

QString Client::sendFile(const QString &conv, const QString &path, const QString &body) {
    // Bad input never enters the outbox (obligation 12): refused here.
    if (const QString why = body.isEmpty() ? proto::checkConv(conv) : proto::checkSend(conv, body); !why.isEmpty())
        return d->refuse(QStringLiteral("sendFile refused: %1").arg(why));
    if (!d->storage.isOpen()) {
        d->reporter.fail(QStringLiteral("INVALID_ARGUMENT"), QStringLiteral("database not open"),
                         QStringLiteral("database not open"));
        return {};
    }
    const QFileInfo info(path);
    if (path.isEmpty() || !info.exists())
        return d->refuse(QStringLiteral("sendFile refused: no file %1").arg(path));
    if (!info.isFile())
        return d->refuse(QStringLiteral("sendFile refused: %1 is not a regular file").arg(path));
    if (const QString why = checkFileName(info.fileName()); !why.isEmpty())
        return d->refuse(QStringLiteral("sendFile refused: %1").arg(why));
    auto tooLarge = [this](qint64 size) {
        d->reporter.fail(QStringLiteral("TOO_LARGE"),
                         QStringLiteral("sendFile refused: %1 bytes, over the limit of %2").arg(size).arg(d->maxFileSize),
                         QStringLiteral("the file is over the size limit"));
        return QString();
    };
    if (info.size() > d->maxFileSize)
        return tooLarge(info.size());
    QFile in(path);
    if (!in.open(QIODevice::ReadOnly))
        return d->refuse(QStringLiteral("sendFile refused: cannot read %1: %2").arg(path, in.errorString()));

    // The store's own copy, named after the cmid, hashed while it is
    // written; QSaveFile: a temporary name, flushed to disk, renamed.
    detail::OutboxRow row;
    row.kind = QStringLiteral("send");
    row.conv = conv;
    row.body = body;
    row.cmid = QUuid::createUuid().toString(QUuid::WithoutBraces);
    const QString copy = d->storage.outgoingFilePath(row.cmid);
    auto copyFailed = [this, &copy](const QString &why) {
        QFile::remove(copy);
        d->reporter.storageFailed(QStringLiteral("sendFile cannot copy the file into the store"), why);
        return QString();
    };
    if (!QDir().mkpath(QFileInfo(copy).path()))
        return copyFailed(QStringLiteral("cannot create %1").arg(QFileInfo(copy).path()));
    QSaveFile out(copy);
    if (!out.open(QIODevice::WriteOnly))
        return copyFailed(out.errorString());
    QCryptographicHash sha(QCryptographicHash::Sha256);
    QByteArray block;
    qint64 size = 0;
    for (;;) {
        block = in.read(1 << 20);
        if (block.isEmpty())
            break;
        size += block.size();
        if (size > d->maxFileSize) { // it grew while we copied
            out.cancelWriting();
            return tooLarge(size);
        }
        sha.addData(block);
        if (out.write(block) != block.size()) {
            out.cancelWriting();
            return copyFailed(out.errorString());
        }
    }
    if (in.error() != QFileDevice::NoError) {
        out.cancelWriting();
        return d->refuse(QStringLiteral("sendFile refused: cannot read %1: %2").arg(path, in.errorString()));
    }
    if (!out.commit())
        return copyFailed(out.errorString());

    detail::OutboxFile file;
    file.name = info.fileName();
    file.mime = QMimeDatabase().mimeTypeForFile(info).name();
    if (!file.mime.contains(u'/'))
        file.mime = QStringLiteral("application/octet-stream");
    file.size = size;
    file.sha256 = QString::fromLatin1(sha.result().toHex());
    row.file = file;
    const QString cmid = d->outbox.enqueue(row);
    if (cmid.isEmpty()) {
        QFile::remove(copy);
        return {};
    }
    d->ephemeral.messageSent(conv); // a send ends typing (contract 13)
    qCDebug(lcClient, "sendFile %s: %s (%lld bytes, %s) as %s", qUtf8Printable(conv), qUtf8Printable(file.name), size,
            qUtf8Printable(file.mime), qUtf8Printable(cmid));
    return cmid;
}

QVariantMap Client::uploadState(const QString &cmid) const {
    const Outbox::Item *item = d->outbox.findCmid(cmid);
    if (!item || !item->row.file)
        return {};
    const detail::OutboxFile &f = *item->row.file;
    return {{QStringLiteral("sent"), f.complete ? f.size : item->uploaded},
            {QStringLiteral("total"), f.size},
            {QStringLiteral("complete"), f.complete}};
}

void Client::setMaxFileSize(qint64 bytes) {
    bytes = std::max<qint64>(0, bytes);
    if (bytes == d->maxFileSize)
        return;
    d->maxFileSize = bytes;
    emit settingsChanged();
}
qint64 Client::maxFileSize() const { return d->maxFileSize; }

void Client::setUploadChunkSize(int bytes) {
    bytes = std::clamp(bytes, 65536, 8 * 1024 * 1024);
    if (bytes == d->outbox.uploader().chunkSize)
        return;
    d->outbox.uploader().chunkSize = bytes;
    emit settingsChanged();
}
int Client::uploadChunkSize() const { return d->outbox.uploader().chunkSize; }

void Client::setUploadRateLimit(qint64 bytesPerSecond) {
    bytesPerSecond = std::max<qint64>(0, bytesPerSecond);
    if (bytesPerSecond == d->outbox.uploader().rateLimit())
        return;
    d->outbox.uploader().setRateLimit(bytesPerSecond);
    emit settingsChanged();
}
qint64 Client::uploadRateLimit() const { return d->outbox.uploader().rateLimit(); }

void ClientPrivate::removeOrphanCopies() {
    QDir dir(storage.filesDir() + QStringLiteral("/outgoing"));
    if (!dir.exists())
        return;
    for (const QString &name : dir.entryList(QDir::Files | QDir::Hidden | QDir::System)) {
        const Outbox::Item *item = outbox.findCmid(name);
        if (item && item->row.file)
            continue;
        qCInfo(lcClient, "removing %s: no outbox entry sends it", qUtf8Printable(dir.filePath(name)));
        dir.remove(name);
    }
}

} // namespace im
