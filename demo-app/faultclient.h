// Arms server fault points over HTTP: POST http://HOST:PORT/lab/fault with
// body "POINT=ACTION[:COUNT]" or "off". Only a server started with
// --enable-faults answers; any other answers 404.
#pragma once

#include <QtCore/QObject>
#include <QtCore/QUrl>

class QNetworkAccessManager;

class FaultClient : public QObject {
    Q_OBJECT
public:
    explicit FaultClient(QObject *parent = nullptr);

    /// http(s)://HOST:PORT/lab/fault for a ws(s)://HOST:PORT/... URL.
    static QUrl labUrl(const QUrl &wsUrl);
    /// "POINT=ACTION" or "POINT=ACTION:COUNT" (count <= 0: no count).
    static QString spec(const QString &point, const QString &action, int count);

    /// Posts `body` to the lab endpoint of `wsUrl`; answers with answered().
    void post(const QUrl &wsUrl, const QString &body);

Q_SIGNALS:
    /// `status` is the HTTP status (0 when there was no HTTP answer at all);
    /// `text` a human-readable summary of the answer.
    void answered(int status, const QString &text);

private:
    QNetworkAccessManager *nam_;
};
