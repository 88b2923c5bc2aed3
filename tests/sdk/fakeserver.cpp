#include "fakeserver.h"

#include <QtCore/QDateTime>
#include <QtCore/QJsonArray>
#include <QtCore/QJsonDocument>
#include <QtCore/QMap>
#include <QtCore/QUuid>
#include <QtWebSockets/QWebSocket>
#include <QtWebSockets/QWebSocketServer>

FakeServer::FakeServer(QObject *parent) : QObject(parent) {}

FakeServer::~FakeServer() { stop(); }

bool FakeServer::listen() {
    server_ = new QWebSocketServer(QStringLiteral("fake"), QWebSocketServer::NonSecureMode, this);
    connect(server_, &QWebSocketServer::newConnection, this, &FakeServer::onConnection);
    return server_->listen(QHostAddress::LocalHost, 0);
}

QUrl FakeServer::url() const {
    return QUrl(QStringLiteral("ws://127.0.0.1:%1/v1/ws").arg(server_->serverPort()));
}

void FakeServer::stop() {
    closeAll();
    if (server_)
        server_->close();
}

void FakeServer::closeAll() {
    const auto sockets = sessions_.keys();
    for (QWebSocket *s : sockets)
        s->abort();
}

void FakeServer::onConnection() {
    while (QWebSocket *s = server_->nextPendingConnection()) {
        ++connections;
        sessions_.insert(s, Session{});
        connect(s, &QWebSocket::textMessageReceived, this, [this, s](const QString &text) {
            const QJsonObject req = QJsonDocument::fromJson(text.toUtf8()).object();
            received.append(req);
            if (onFrame)
                onFrame(req);
            emit frameReceived(req);
            if (sessions_.contains(s))
                handle(s, req);
        });
        connect(s, &QWebSocket::disconnected, this, [this, s] {
            sessions_.remove(s);
            s->deleteLater();
        });
    }
}

QJsonObject FakeServer::demoEvent(const QString &conv, qint64 seq, const QString &sender, const QString &body,
                                  qint64 epoch) {
    return QJsonObject{{QStringLiteral("conv"), conv},
                       {QStringLiteral("seq"), seq},
                       {QStringLiteral("mid"), QUuid::createUuid().toString(QUuid::WithoutBraces)},
                       {QStringLiteral("kind"), QStringLiteral("msg")},
                       {QStringLiteral("sender"), sender},
                       {QStringLiteral("body"), body},
                       {QStringLiteral("ts"), QDateTime::currentMSecsSinceEpoch()},
                       {QStringLiteral("epoch"), epoch}};
}

qint64 FakeServer::addEvent(const QString &conv, QJsonObject ev) {
    Conv &c = convs[conv];
    const qint64 seq = c.head() + 1;
    ev.insert(QStringLiteral("conv"), conv);
    ev.insert(QStringLiteral("seq"), seq);
    ev.insert(QStringLiteral("mid"), QUuid::createUuid().toString(QUuid::WithoutBraces));
    ev.insert(QStringLiteral("ts"), QDateTime::currentMSecsSinceEpoch());
    ev.insert(QStringLiteral("epoch"), c.epoch);
    c.events.append(ev);
    if (pushEvents) {
        const QJsonObject push{{QStringLiteral("t"), QStringLiteral("event")}, {QStringLiteral("ev"), ev}};
        const QByteArray text = QJsonDocument(push).toJson(QJsonDocument::Compact);
        for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
            if (it->subscribed && c.members.contains(it->user))
                it.key()->sendTextMessage(QString::fromUtf8(text));
    }
    return seq;
}

qint64 FakeServer::append(const QString &conv, const QString &sender, const QString &body, const QString &cmid) {
    QJsonObject ev{{QStringLiteral("kind"), QStringLiteral("msg")},
                   {QStringLiteral("sender"), sender},
                   {QStringLiteral("body"), body}};
    if (eventsCarryCmid && !cmid.isEmpty())
        ev.insert(QStringLiteral("cmid"), cmid);
    return addEvent(conv, ev);
}

qint64 FakeServer::appendRecall(const QString &conv, const QString &sender, qint64 target, const QString &cmid) {
    QJsonObject ev{{QStringLiteral("kind"), QStringLiteral("recall")},
                   {QStringLiteral("sender"), sender},
                   {QStringLiteral("target"), target}};
    if (eventsCarryCmid && !cmid.isEmpty())
        ev.insert(QStringLiteral("cmid"), cmid);
    return addEvent(conv, ev);
}

qint64 FakeServer::addMember(const QString &conv, const QString &user) {
    Conv &c = convs[conv];
    if (!c.members.contains(user))
        c.members.append(user);
    return addEvent(conv, QJsonObject{{QStringLiteral("kind"), QStringLiteral("join")}, {QStringLiteral("user"), user}});
}

qint64 FakeServer::removeMember(const QString &conv, const QString &user) {
    const qint64 seq =
        addEvent(conv, QJsonObject{{QStringLiteral("kind"), QStringLiteral("leave")}, {QStringLiteral("user"), user}});
    convs[conv].members.removeAll(user);
    return seq;
}

void FakeServer::createConv(const QString &conv, const QStringList &members, const QString &kind) {
    Conv &c = convs[conv];
    c.kind = kind;
    for (const QString &u : members)
        addMember(conv, u);
}

void FakeServer::pushToAll(const QJsonObject &frame) {
    const QByteArray text = QJsonDocument(frame).toJson(QJsonDocument::Compact);
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
        if (it->subscribed)
            it.key()->sendTextMessage(QString::fromUtf8(text));
}

void FakeServer::pushTokenExpiring(qint64 expMs) {
    const QByteArray text = QJsonDocument(QJsonObject{{QStringLiteral("t"), QStringLiteral("token_expiring")},
                                                      {QStringLiteral("exp"), expMs}})
                                .toJson(QJsonDocument::Compact);
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
        if (!it->user.isEmpty())
            it.key()->sendTextMessage(QString::fromUtf8(text));
}

void FakeServer::closeAllWithCode(int code, const QString &reason) {
    const auto sockets = sessions_.keys();
    for (QWebSocket *s : sockets)
        s->close(QWebSocketProtocol::CloseCode(code), reason);
}

QString FakeServer::jwt(const QString &sub, qint64 expSecs) {
    auto part = [](const QJsonObject &o) {
        return QString::fromLatin1(QJsonDocument(o).toJson(QJsonDocument::Compact).toBase64(
            QByteArray::Base64UrlEncoding | QByteArray::OmitTrailingEquals));
    };
    return part(QJsonObject{{QStringLiteral("alg"), QStringLiteral("HS256")}, {QStringLiteral("typ"), QStringLiteral("JWT")}})
           + QLatin1Char('.')
           + part(QJsonObject{{QStringLiteral("sub"), sub},
                              {QStringLiteral("device"), sub + QStringLiteral("-d1")},
                              {QStringLiteral("exp"), expSecs}})
           + QStringLiteral(".c2ln");
}

QString FakeServer::userOfToken(const QString &token) const {
    if (rejectedTokens.contains(token))
        return {};
    if (token.startsWith(QLatin1String("tok-")))
        return token.mid(4);
    const QStringList parts = token.split(QLatin1Char('.'));
    if (parts.size() != 3)
        return {};
    const QJsonObject claims = QJsonDocument::fromJson(QByteArray::fromBase64(
                                                           parts[1].toLatin1(), QByteArray::Base64UrlEncoding))
                                   .object();
    if (claims.value(QStringLiteral("exp")).toInteger() * 1000 <= QDateTime::currentMSecsSinceEpoch())
        return {};
    return claims.value(QStringLiteral("sub")).toString();
}

void FakeServer::bumpEpoch(const QString &conv) { ++convs[conv].epoch; }

void FakeServer::releaseHeld() {
    const auto held = held_;
    held_.clear();
    for (const auto &[s, text] : held)
        if (sessions_.contains(s))
            s->sendTextMessage(QString::fromUtf8(text));
}

QList<QJsonObject> FakeServer::requests(const QString &type) const {
    QList<QJsonObject> out;
    for (const QJsonObject &o : received)
        if (o.value(QStringLiteral("t")).toString() == type)
            out.append(o);
    return out;
}

QStringList FakeServer::distinctCmids(const QString &conv) const {
    QStringList out;
    for (const QJsonObject &o : requests(QStringLiteral("send"))) {
        if (!conv.isEmpty() && o.value(QStringLiteral("conv")).toString() != conv)
            continue;
        const QString c = o.value(QStringLiteral("cmid")).toString();
        if (!out.contains(c))
            out.append(c);
    }
    return out;
}

int FakeServer::subscribedCount() const {
    int n = 0;
    for (const Session &s : sessions_)
        n += s.subscribed ? 1 : 0;
    return n;
}

void FakeServer::reply(QWebSocket *s, const QJsonObject &req, QJsonObject body) {
    if (req.contains(QStringLiteral("rid")))
        body.insert(QStringLiteral("rid"), req.value(QStringLiteral("rid")));
    const QByteArray text = QJsonDocument(body).toJson(QJsonDocument::Compact);
    const QString t = req.value(QStringLiteral("t")).toString();
    if (holdReplies.value(t) > 0) {
        --holdReplies[t];
        held_.append({s, text});
        return;
    }
    s->sendTextMessage(QString::fromUtf8(text));
}

void FakeServer::error(QWebSocket *s, const QJsonObject &req, const QString &code) {
    reply(s, req, QJsonObject{{QStringLiteral("t"), QStringLiteral("error")},
                              {QStringLiteral("code"), code},
                              {QStringLiteral("msg"), code.toLower()}});
}

void FakeServer::handle(QWebSocket *s, const QJsonObject &req) {
    const QString t = req.value(QStringLiteral("t")).toString();
    if (closeOn.value(t) > 0) {
        --closeOn[t];
        s->abort();
        return;
    }
    if (unavailable.value(t) > 0) {
        --unavailable[t];
        error(s, req, QStringLiteral("UNAVAILABLE"));
        return;
    }
    if (rateLimited.value(t) > 0) {
        --rateLimited[t];
        reply(s, req, QJsonObject{{QStringLiteral("t"), QStringLiteral("error")},
                                  {QStringLiteral("code"), QStringLiteral("RATE_LIMITED")},
                                  {QStringLiteral("msg"), QStringLiteral("over the sender's rate")},
                                  {QStringLiteral("retry_ms"), rateLimitRetryMs}});
        return;
    }
    if (failWith.contains(t)) {
        error(s, req, failWith.value(t));
        return;
    }
    QJsonObject out = process(s, req);
    if (out.isEmpty())
        return;
    if (dropReplies.value(t) > 0) {
        --dropReplies[t];
        return;
    }
    reply(s, req, out);
    // Contract 4 / 4a: a refused hello or refresh closes the connection.
    if ((t == u"hello" || t == u"refresh") && out.value(QStringLiteral("code")).toString() == u"UNAUTHENTICATED")
        s->close(QWebSocketProtocol::CloseCodePolicyViolated, QStringLiteral("unauthenticated"));
}

static QJsonObject err(const QString &code) {
    return QJsonObject{{QStringLiteral("t"), QStringLiteral("error")},
                       {QStringLiteral("code"), code},
                       {QStringLiteral("msg"), code.toLower()}};
}

QJsonObject FakeServer::process(QWebSocket *s, const QJsonObject &req) {
    Session &ses = sessions_[s];
    const QString t = req.value(QStringLiteral("t")).toString();
    const QString convId = req.value(QStringLiteral("conv")).toString();
    if (t == u"hello") {
        const QString token = req.value(QStringLiteral("token")).toString();
        const QString install = req.value(QStringLiteral("install")).toString();
        installsSeen.append(install);
        const QString user = userOfToken(token);
        if (user.isEmpty())
            return err(QStringLiteral("UNAUTHENTICATED"));
        if (staleInstalls.contains(install))
            return err(QStringLiteral("STALE_INSTALL"));
        ses.user = user;
        ses.token = token;
        ses.device = ses.user + QStringLiteral("-d1");
        return QJsonObject{{QStringLiteral("t"), QStringLiteral("welcome")},
                           {QStringLiteral("user"), ses.user},
                           {QStringLiteral("device"), ses.device},
                           {QStringLiteral("gateway"), QStringLiteral("fake-gw")},
                           {QStringLiteral("server_time"), QDateTime::currentMSecsSinceEpoch()}};
    }
    if (ses.user.isEmpty())
        return err(QStringLiteral("UNAUTHENTICATED"));
    if (t == u"refresh") {
        const QString token = req.value(QStringLiteral("token")).toString();
        if (userOfToken(token) != ses.user)
            return err(QStringLiteral("UNAUTHENTICATED"));
        ses.token = token;
        return QJsonObject{{QStringLiteral("t"), QStringLiteral("refreshed")},
                           {QStringLiteral("exp"), refreshedExpMs > 0 ? refreshedExpMs
                                                                      : QDateTime::currentMSecsSinceEpoch() + 3600000}};
    }
    if (t == u"sub") {
        ses.subscribed = true;
        return QJsonObject{{QStringLiteral("t"), QStringLiteral("subscribed")}};
    }
    if (t == u"convs") {
        QJsonArray list;
        for (auto it = convs.cbegin(); it != convs.cend(); ++it) {
            if (!it->members.contains(ses.user))
                continue;
            const qint64 rd = it->read.value(ses.user);
            qint64 unread = 0;
            for (const QJsonObject &e : it->events)
                if (e.value(QStringLiteral("kind")).toString() == u"msg"
                    && e.value(QStringLiteral("sender")).toString() != ses.user
                    && e.value(QStringLiteral("seq")).toInteger() > rd)
                    ++unread;
            list.append(QJsonObject{{QStringLiteral("conv"), it.key()},
                                    {QStringLiteral("kind"), it->kind},
                                    {QStringLiteral("head"), it->head()},
                                    {QStringLiteral("delivered"), it->delivered.value(ses.device)},
                                    {QStringLiteral("read"), rd},
                                    {QStringLiteral("unread"), unread},
                                    {QStringLiteral("epoch"), it->epoch},
                                    {QStringLiteral("min_seq"), it->minSeq}});
        }
        return QJsonObject{{QStringLiteral("t"), QStringLiteral("convs")}, {QStringLiteral("convs"), list}};
    }
    if (!convs.contains(convId) || !convs[convId].members.contains(ses.user))
        return err(QStringLiteral("NOT_MEMBER"));
    Conv &c = convs[convId];
    if (t == u"edit" || t == u"react")
        return change(t, convId, req, ses);
    if (t == u"send" || t == u"recall") {
        const QString cmid = req.value(QStringLiteral("cmid")).toString();
        const QString key = ses.user + QLatin1Char('\n') + cmid;
        const QString fingerprint = t + QLatin1Char('\n')
            + (t == u"send" ? req.value(QStringLiteral("body")).toString() + QStringLiteral("\nreply:")
                                  + QString::number(req.value(QStringLiteral("reply_to")).toInteger())
                            : QString::number(req.value(QStringLiteral("target")).toInteger()));
        if (c.keys.contains(key)) {
            if (c.fingerprints.value(key) != fingerprint)
                return err(QStringLiteral("IDEMPOTENCY_MISMATCH"));
            const qint64 seq = c.keys.value(key);
            const QJsonObject &ev = c.events.at(seq - 1);
            QJsonObject dup{{QStringLiteral("t"), t == u"send" ? QStringLiteral("sent") : QStringLiteral("recalled")},
                            {QStringLiteral("conv"), convId},
                            {QStringLiteral("seq"), seq},
                            {QStringLiteral("dup"), true}};
            if (t == u"send") {
                dup.insert(QStringLiteral("mid"), ev.value(QStringLiteral("mid")));
                dup.insert(QStringLiteral("epoch"), c.epoch);
            }
            return dup;
        }
        // As imserver: a send naming a `prev` of this sender that is not
        // committed is refused as retryable, nothing appended.
        const QString prev = req.value(QStringLiteral("prev")).toString();
        if (t == u"send" && !prev.isEmpty() && !c.keys.contains(ses.user + QLatin1Char('\n') + prev))
            return err(QStringLiteral("UNAVAILABLE"));
        qint64 seq = 0;
        if (t == u"send") {
            const qint64 replyTo = req.value(QStringLiteral("reply_to")).toInteger();
            if (req.contains(QStringLiteral("reply_to"))
                && (replyTo < c.minSeq || replyTo > c.head()
                    || c.events.at(replyTo - 1).value(QStringLiteral("kind")).toString() != u"msg"))
                return err(QStringLiteral("NOT_FOUND"));
            QJsonObject ev{{QStringLiteral("kind"), QStringLiteral("msg")},
                           {QStringLiteral("sender"), ses.user},
                           {QStringLiteral("body"), req.value(QStringLiteral("body")).toString()}};
            if (replyTo > 0)
                ev.insert(QStringLiteral("reply_to"), replyTo);
            if (eventsCarryCmid && !cmid.isEmpty())
                ev.insert(QStringLiteral("cmid"), cmid);
            seq = addEvent(convId, ev);
        } else {
            const qint64 target = req.value(QStringLiteral("target")).toInteger();
            if (target < c.minSeq || target > c.head())
                return err(QStringLiteral("NOT_FOUND"));
            const QJsonObject &tev = c.events.at(target - 1);
            if (tev.value(QStringLiteral("kind")).toString() != u"msg")
                return err(QStringLiteral("INVALID_ARGUMENT"));
            if (tev.value(QStringLiteral("sender")).toString() != ses.user)
                return err(QStringLiteral("NOT_SENDER"));
            for (const QJsonObject &e : c.events)
                if (e.value(QStringLiteral("kind")).toString() == u"recall"
                    && e.value(QStringLiteral("target")).toInteger() == target)
                    return err(QStringLiteral("ALREADY_RECALLED"));
            if (QDateTime::currentMSecsSinceEpoch() > tev.value(QStringLiteral("ts")).toInteger() + c.recallWindowMs)
                return err(QStringLiteral("RECALL_WINDOW_EXPIRED"));
            seq = appendRecall(convId, ses.user, target, cmid);
        }
        convs[convId].keys.insert(key, seq);
        convs[convId].fingerprints.insert(key, fingerprint);
        const QJsonObject &ev = convs[convId].events.at(seq - 1);
        if (t == u"recall") // imserver's `recalled` reply: conv, seq, dup
            return QJsonObject{{QStringLiteral("t"), QStringLiteral("recalled")},
                               {QStringLiteral("conv"), convId},
                               {QStringLiteral("seq"), seq},
                               {QStringLiteral("dup"), false}};
        return QJsonObject{{QStringLiteral("t"), QStringLiteral("sent")},
                           {QStringLiteral("conv"), convId},
                           {QStringLiteral("seq"), seq},
                           {QStringLiteral("mid"), ev.value(QStringLiteral("mid"))},
                           {QStringLiteral("dup"), false},
                           {QStringLiteral("epoch"), convs[convId].epoch}};
    }
    if (t == u"sync") {
        const qint64 after = req.value(QStringLiteral("after")).toInteger();
        qint64 limit = req.contains(QStringLiteral("limit")) ? req.value(QStringLiteral("limit")).toInteger() : 50;
        if (pageLimit > 0)
            limit = std::min<qint64>(limit, pageLimit);
        if (req.contains(QStringLiteral("epoch")) && req.value(QStringLiteral("epoch")).toInteger() != c.epoch)
            return err(QStringLiteral("EPOCH_CHANGED"));
        if (after > c.head())
            return err(QStringLiteral("CURSOR_AHEAD"));
        QJsonArray evs;
        qint64 next = after;
        for (qint64 seq = std::max(after + 1, c.minSeq); seq <= c.head() && evs.size() < limit; ++seq) {
            evs.append(withChanges(c, c.events.at(seq - 1), ses.user));
            next = seq;
        }
        if (evs.isEmpty())
            next = std::max(after, c.minSeq - 1);
        return QJsonObject{{QStringLiteral("t"), QStringLiteral("page")},
                           {QStringLiteral("conv"), convId},
                           {QStringLiteral("events"), evs},
                           {QStringLiteral("next_after"), next},
                           {QStringLiteral("has_more"), next < c.head()},
                           {QStringLiteral("head"), c.head()},
                           {QStringLiteral("min_seq"), c.minSeq},
                           {QStringLiteral("trimmed"), after < c.minSeq - 1},
                           {QStringLiteral("epoch"), c.epoch}};
    }
    if (t == u"history") { // contract section 6: the newest `limit` events below `before`
        const qint64 before = req.value(QStringLiteral("before")).toInteger();
        const qint64 limit = req.contains(QStringLiteral("limit")) ? req.value(QStringLiteral("limit")).toInteger() : 50;
        if (req.contains(QStringLiteral("epoch")) && req.value(QStringLiteral("epoch")).toInteger() != c.epoch)
            return err(QStringLiteral("EPOCH_CHANGED"));
        const qint64 top = before == 0 ? c.head() : std::min(before - 1, c.head());
        qint64 oldest = top + 1;
        QList<QJsonObject> window;
        for (qint64 seq = top; seq >= c.minSeq && seq >= 1 && window.size() < limit; --seq) {
            window.prepend(c.events.at(seq - 1));
            oldest = seq;
        }
        QJsonArray evs;
        for (const QJsonObject &e : std::as_const(window))
            evs.append(withChanges(c, e, ses.user));
        ++historyRequests;
        return QJsonObject{{QStringLiteral("t"), QStringLiteral("page")},
                           {QStringLiteral("conv"), convId},
                           {QStringLiteral("events"), evs},
                           {QStringLiteral("oldest"), oldest},
                           {QStringLiteral("has_older"), oldest > std::max<qint64>(c.minSeq, 1)},
                           {QStringLiteral("head"), c.head()},
                           {QStringLiteral("min_seq"), c.minSeq},
                           {QStringLiteral("trimmed"), false},
                           {QStringLiteral("epoch"), c.epoch}};
    }
    if (t == u"ack" || t == u"read") {
        const qint64 seq = req.value(QStringLiteral("seq")).toInteger();
        if (seq > c.head())
            return err(QStringLiteral("CURSOR_AHEAD"));
        if (t == u"ack") {
            c.delivered[ses.device] = std::max(c.delivered.value(ses.device), seq);
            return QJsonObject{{QStringLiteral("t"), QStringLiteral("acked")},
                               {QStringLiteral("conv"), convId},
                               {QStringLiteral("delivered"), c.delivered.value(ses.device)}};
        }
        c.read[ses.user] = std::max(c.read.value(ses.user), seq);
        return QJsonObject{{QStringLiteral("t"), QStringLiteral("read_ok")},
                           {QStringLiteral("conv"), convId},
                           {QStringLiteral("read"), c.read.value(ses.user)}};
    }
    if (t == u"fetch") {
        const qint64 seq = req.value(QStringLiteral("seq")).toInteger();
        if (seq < c.minSeq || seq > c.head())
            return err(QStringLiteral("NOT_FOUND"));
        return QJsonObject{{QStringLiteral("t"), QStringLiteral("fetched")},
                           {QStringLiteral("ev"), withChanges(c, c.events.at(seq - 1), ses.user)}};
    }
    return err(QStringLiteral("INVALID_ARGUMENT"));
}

QJsonObject FakeServer::withChanges(const Conv &c, const QJsonObject &ev, const QString &asker) const {
    if (!annotateChanges || ev.value(QStringLiteral("kind")).toString() != u"msg")
        return ev;
    const qint64 seq = ev.value(QStringLiteral("seq")).toInteger();
    QJsonObject out = ev;
    QJsonObject edit;
    qint64 reactionsSeq = 0;
    QMap<QString, qint64> counts;
    QSet<QString> mine;
    for (const QJsonObject &e : c.events) {
        if (e.value(QStringLiteral("target")).toInteger() != seq)
            continue;
        const QString kind = e.value(QStringLiteral("kind")).toString();
        if (kind == u"recall") {
            out.insert(QStringLiteral("recalled"), true);
        } else if (kind == u"edit") {
            edit = QJsonObject{{QStringLiteral("seq"), e.value(QStringLiteral("seq"))},
                               {QStringLiteral("body"), e.value(QStringLiteral("body"))},
                               {QStringLiteral("ts"), e.value(QStringLiteral("ts"))}};
        } else if (kind == u"reaction") {
            const QString emoji = e.value(QStringLiteral("emoji")).toString();
            const bool on = e.value(QStringLiteral("on")).toBool();
            counts[emoji] += on ? 1 : -1;
            if (e.value(QStringLiteral("sender")).toString() == asker) {
                if (on)
                    mine.insert(emoji);
                else
                    mine.remove(emoji);
            }
            reactionsSeq = e.value(QStringLiteral("seq")).toInteger();
        }
    }
    if (!edit.isEmpty())
        out.insert(QStringLiteral("edit"), edit);
    QList<QPair<QString, qint64>> list;
    for (auto it = counts.cbegin(); it != counts.cend(); ++it)
        if (it.value() > 0)
            list.append({it.key(), it.value()});
    std::stable_sort(list.begin(), list.end(), [](const auto &a, const auto &b) { return a.second > b.second; });
    QJsonArray reactions;
    for (const auto &[emoji, count] : std::as_const(list))
        reactions.append(QJsonObject{{QStringLiteral("emoji"), emoji},
                                     {QStringLiteral("count"), count},
                                     {QStringLiteral("me"), mine.contains(emoji)}});
    if (!reactions.isEmpty())
        out.insert(QStringLiteral("reactions"), reactions);
    if (reactionsSeq > 0)
        out.insert(QStringLiteral("reactions_seq"), reactionsSeq);
    return out;
}

QJsonObject FakeServer::change(const QString &t, const QString &convId, const QJsonObject &req, const Session &ses) {
    auto err = [](const QString &code) {
        return QJsonObject{{QStringLiteral("t"), QStringLiteral("error")}, {QStringLiteral("code"), code}};
    };
    Conv &c = convs[convId];
    const bool edit = t == u"edit";
    const QString cmid = req.value(QStringLiteral("cmid")).toString();
    const qint64 target = req.value(QStringLiteral("target")).toInteger();
    const QString emoji = req.value(QStringLiteral("emoji")).toString();
    const bool on = req.value(QStringLiteral("on")).toBool();
    const QString key = ses.user + QLatin1Char('\n') + cmid;
    const QString fingerprint = edit ? QStringLiteral("edit\n%1\n%2").arg(target).arg(req.value(QStringLiteral("body")).toString())
                                     : QStringLiteral("react\n%1\n%2\n%3").arg(target).arg(emoji).arg(on ? 1 : 0);
    auto answer = [&](qint64 seq, bool dup, bool changed) {
        QJsonObject o{{QStringLiteral("t"), edit ? QStringLiteral("edited") : QStringLiteral("reacted")},
                      {QStringLiteral("conv"), convId},
                      {QStringLiteral("seq"), seq > 0 ? QJsonValue(seq) : QJsonValue(QJsonValue::Null)},
                      {QStringLiteral("dup"), dup},
                      {QStringLiteral("epoch"), c.epoch}};
        if (!edit)
            o.insert(QStringLiteral("changed"), changed);
        return o;
    };
    if (c.keys.contains(key)) {
        if (c.fingerprints.value(key) != fingerprint)
            return err(QStringLiteral("IDEMPOTENCY_MISMATCH"));
        return answer(c.keys.value(key), true, true);
    }
    if (target < c.minSeq || target < 1 || target > c.head())
        return err(QStringLiteral("NOT_FOUND"));
    const QJsonObject &tev = c.events.at(target - 1);
    if (tev.value(QStringLiteral("kind")).toString() != u"msg")
        return err(QStringLiteral("INVALID_ARGUMENT"));
    if (edit && tev.value(QStringLiteral("sender")).toString() != ses.user)
        return err(QStringLiteral("NOT_SENDER"));
    for (const QJsonObject &e : c.events)
        if (e.value(QStringLiteral("kind")).toString() == u"recall" && e.value(QStringLiteral("target")).toInteger() == target)
            return err(QStringLiteral("ALREADY_RECALLED"));
    QJsonObject ev{{QStringLiteral("sender"), ses.user}, {QStringLiteral("target"), target}};
    if (eventsCarryCmid)
        ev.insert(QStringLiteral("cmid"), cmid);
    if (edit) {
        if (c.editWindowMs == 0
            || QDateTime::currentMSecsSinceEpoch() > tev.value(QStringLiteral("ts")).toInteger() + c.editWindowMs)
            return err(QStringLiteral("EDIT_WINDOW_EXPIRED"));
        ev.insert(QStringLiteral("kind"), QStringLiteral("edit"));
        ev.insert(QStringLiteral("body"), req.value(QStringLiteral("body")).toString());
    } else {
        const QString state = QStringLiteral("%1\n%2\n%3").arg(ses.user).arg(target).arg(emoji);
        if (c.reactionState.contains(state) == on) // already as asked: nothing appended, no key
            return answer(c.reactionState.value(state), false, false);
        ev.insert(QStringLiteral("kind"), QStringLiteral("reaction"));
        ev.insert(QStringLiteral("emoji"), emoji);
        ev.insert(QStringLiteral("on"), on);
    }
    const qint64 seq = addEvent(convId, ev);
    if (!edit) {
        const QString state = QStringLiteral("%1\n%2\n%3").arg(ses.user).arg(target).arg(emoji);
        if (on)
            c.reactionState.insert(state, seq);
        else
            c.reactionState.remove(state);
    }
    convs[convId].keys.insert(key, seq);
    convs[convId].fingerprints.insert(key, fingerprint);
    return answer(seq, false, true);
}
