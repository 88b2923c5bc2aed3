#include "codec_p.h"

#include <QtCore/QJsonArray>
#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>
#include <QtCore/QStringList>

#include <cmath>

namespace im::proto {
namespace {

// A small reader that records the first problem and keeps going, so one
// decode function per frame type stays linear.
class Reader {
public:
    explicit Reader(const QJsonObject &o) : o_(o) {}

    QString str(const char *key) {
        const QJsonValue v = o_.value(QLatin1String(key));
        if (!v.isString()) { fail(key, "string"); return {}; }
        return v.toString();
    }
    QString optStr(const char *key) {
        const QJsonValue v = o_.value(QLatin1String(key));
        if (v.isUndefined() || v.isNull()) return {};
        if (!v.isString()) { fail(key, "string"); return {}; }
        return v.toString();
    }
    qint64 num(const char *key) {
        const QJsonValue v = o_.value(QLatin1String(key));
        return toInt(v, key);
    }
    std::optional<qint64> optNum(const char *key) {
        const QJsonValue v = o_.value(QLatin1String(key));
        if (v.isUndefined() || v.isNull()) return std::nullopt;
        return toInt(v, key);
    }
    bool boolean(const char *key) {
        const QJsonValue v = o_.value(QLatin1String(key));
        if (!v.isBool()) { fail(key, "bool"); return false; }
        return v.toBool();
    }
    bool optBool(const char *key) {
        const QJsonValue v = o_.value(QLatin1String(key));
        if (v.isUndefined() || v.isNull()) return false;
        if (!v.isBool()) { fail(key, "bool"); return false; }
        return v.toBool();
    }
    QJsonArray array(const char *key) {
        const QJsonValue v = o_.value(QLatin1String(key));
        if (!v.isArray()) { fail(key, "array"); return {}; }
        return v.toArray();
    }
    QJsonObject object(const char *key) {
        const QJsonValue v = o_.value(QLatin1String(key));
        if (!v.isObject()) { fail(key, "object"); return {}; }
        return v.toObject();
    }
    void fail(const QString &what) { if (error_.isEmpty()) error_ = what; }
    const QString &error() const { return error_; }

private:
    qint64 toInt(const QJsonValue &v, const char *key) {
        if (!v.isDouble()) { fail(key, "integer"); return 0; }
        const double d = v.toDouble();
        if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9007199254740992.0) {
            fail(key, "integer");
            return 0;
        }
        return static_cast<qint64>(d);
    }
    void fail(const char *key, const char *type) {
        fail(QStringLiteral("field '%1' missing or not a %2")
                 .arg(QLatin1String(key), QLatin1String(type)));
    }
    QJsonObject o_;
    QString error_;
};

Event readEvent(const QJsonObject &o, Reader &outer) {
    Reader r(o);
    Event e;
    e.conv = r.str("conv");
    e.seq = r.num("seq");
    e.mid = r.optStr("mid");
    e.kind = r.str("kind");
    e.sender = r.optStr("sender");
    e.body = r.optStr("body");
    e.ts = r.optNum("ts").value_or(0);
    e.epoch = r.optNum("epoch").value_or(0);
    if (e.kind == u"recall" || e.kind == u"edit" || e.kind == u"reaction")
        e.target = r.num("target");
    e.user = r.optStr("user");
    e.cmid = r.optStr("cmid");
    if (e.kind == u"reaction") {
        e.emoji = r.str("emoji");
        e.on = r.boolean("on");
    }
    // Contract section 12: a msg's reply_to and its later changes.
    e.replyTo = r.optNum("reply_to").value_or(0);
    e.recalled = r.optBool("recalled");
    e.erased = r.optBool("erased");
    if (o.contains(QStringLiteral("edit"))) {
        Reader ed(r.object("edit"));
        e.editSeq = ed.num("seq");
        e.editBody = ed.str("body");
        e.editTs = ed.optNum("ts").value_or(0);
        if (!ed.error().isEmpty())
            r.fail(QStringLiteral("edit: ") + ed.error());
        else if (e.editSeq <= e.seq)
            r.fail(QStringLiteral("edit: seq not above the message's"));
    }
    if (o.contains(QStringLiteral("reactions"))) {
        for (const QJsonValue &v : r.array("reactions")) {
            if (!v.isObject()) { r.fail(QStringLiteral("reactions: element is not an object")); break; }
            Reader rr(v.toObject());
            Reaction x{rr.str("emoji"), rr.num("count"), rr.optBool("me")};
            if (!rr.error().isEmpty()) { r.fail(QStringLiteral("reactions: ") + rr.error()); break; }
            if (x.count < 1) { r.fail(QStringLiteral("reactions: count below 1")); break; }
            e.reactions.append(x);
        }
    }
    e.reactionsSeq = r.optNum("reactions_seq").value_or(0);
    if (o.contains(QStringLiteral("attachments"))) {
        for (const QJsonValue &v : r.array("attachments")) {
            if (!v.isObject()) { r.fail(QStringLiteral("attachments: element is not an object")); break; }
            Reader ar(v.toObject());
            Attachment a{ar.str("att_id"), ar.str("name"), ar.str("mime"), ar.num("size"), ar.str("sha256")};
            if (!ar.error().isEmpty()) { r.fail(QStringLiteral("attachments: ") + ar.error()); break; }
            if (a.id.isEmpty() || a.size < 0) { r.fail(QStringLiteral("attachments: empty att_id or negative size")); break; }
            e.attachments.append(a);
        }
    }
    if (e.seq < 1)
        r.fail(QStringLiteral("event seq must be >= 1"));
    if (!r.error().isEmpty())
        outer.fail(QStringLiteral("event: ") + r.error());
    return e;
}

PresenceState readPresence(const QJsonObject &o, Reader &outer) {
    Reader r(o);
    PresenceState p;
    p.user = r.str("user");
    p.online = r.boolean("online");
    p.lastSeen = r.optNum("last_seen").value_or(0); // null: never seen online
    if (!r.error().isEmpty())
        outer.fail(QStringLiteral("presence: ") + r.error());
    return p;
}

QByteArray toFrame(const QJsonObject &o) {
    return QJsonDocument(o).toJson(QJsonDocument::Compact);
}

QJsonObject request(const char *type, const QString &rid) {
    QJsonObject o{{QStringLiteral("t"), QLatin1String(type)}};
    if (!rid.isEmpty())
        o.insert(QStringLiteral("rid"), rid);
    return o;
}

} // namespace

std::optional<Incoming> decode(const QByteArray &frame, QString *error, QString *ridOut) {
    QJsonParseError pe{};
    const QJsonDocument doc = QJsonDocument::fromJson(frame, &pe);
    if (pe.error != QJsonParseError::NoError || !doc.isObject()) {
        if (error) *error = QStringLiteral("frame is not a JSON object");
        return std::nullopt;
    }
    const QJsonObject o = doc.object();
    Reader r(o);
    Incoming in;
    in.rid = r.optStr("rid");
    if (ridOut) *ridOut = in.rid;
    const QString t = r.str("t");
    if (!r.error().isEmpty()) {
        if (error) *error = r.error();
        return std::nullopt;
    }

    if (t == u"welcome") {
        Welcome w;
        w.user = r.str("user");
        w.device = r.str("device");
        w.gateway = r.optStr("gateway");
        w.serverTime = r.optNum("server_time").value_or(0);
        in.body = w;
    } else if (t == u"sent") {
        Sent s;
        s.conv = r.str("conv");
        s.seq = r.num("seq");
        s.mid = r.optStr("mid");
        s.dup = r.optBool("dup");
        s.epoch = r.optNum("epoch").value_or(0);
        in.body = s;
    } else if (t == u"page") {
        Page p;
        p.conv = r.str("conv");
        for (const QJsonValue &v : r.array("events")) {
            if (!v.isObject()) { r.fail(QStringLiteral("events: element is not an object")); break; }
            Event e = readEvent(v.toObject(), r);
            if (e.conv != p.conv) r.fail(QStringLiteral("events: event of another conversation"));
            p.events.append(std::move(e));
        }
        // A history window carries oldest/has_older, a sync page next_after/has_more.
        p.history = o.contains(QStringLiteral("oldest"));
        if (p.history) {
            p.oldest = r.num("oldest");
            p.hasOlder = r.boolean("has_older");
        } else {
            p.nextAfter = r.num("next_after");
            p.hasMore = r.boolean("has_more");
        }
        p.head = r.num("head");
        p.minSeq = r.optNum("min_seq").value_or(1);
        p.trimmed = r.optBool("trimmed");
        p.epoch = r.num("epoch");
        for (qsizetype i = 1; i < p.events.size(); ++i)
            if (p.events[i].seq <= p.events[i - 1].seq)
                r.fail(QStringLiteral("events: not in ascending seq order"));
        if (!p.history && !p.events.isEmpty() && p.nextAfter < p.events.last().seq)
            r.fail(QStringLiteral("next_after below the last event"));
        if (p.history && !p.events.isEmpty() && (p.oldest > p.events.first().seq || p.events.last().seq > p.head))
            r.fail(QStringLiteral("history window does not cover its events"));
        in.body = std::move(p);
    } else if (t == u"acked") {
        in.body = Acked{r.str("conv"), r.num("delivered")};
    } else if (t == u"read_ok") {
        in.body = ReadOk{r.str("conv"), r.num("read")};
    } else if (t == u"recalled") {
        Recalled rc;
        rc.conv = r.str("conv");
        rc.seq = r.num("seq");
        rc.dup = r.optBool("dup");
        in.body = rc;
    } else if (t == u"edited") {
        Edited ed;
        ed.conv = r.str("conv");
        ed.seq = r.num("seq");
        ed.dup = r.optBool("dup");
        ed.epoch = r.optNum("epoch").value_or(0);
        in.body = ed;
    } else if (t == u"reacted") {
        Reacted rc;
        rc.conv = r.str("conv");
        rc.seq = r.optNum("seq").value_or(0); // null: an on:false that found nothing
        rc.dup = r.optBool("dup");
        rc.changed = r.boolean("changed");
        rc.epoch = r.optNum("epoch").value_or(0);
        in.body = rc;
    } else if (t == u"convs") {
        Convs cs;
        for (const QJsonValue &v : r.array("convs")) {
            if (!v.isObject()) { r.fail(QStringLiteral("convs: element is not an object")); break; }
            Reader c(v.toObject());
            ConvInfo ci;
            ci.conv = c.str("conv");
            ci.kind = c.optStr("kind");
            ci.head = c.num("head");
            ci.delivered = c.optNum("delivered").value_or(0);
            ci.read = c.optNum("read").value_or(0);
            ci.unread = c.optNum("unread").value_or(0);
            ci.epoch = c.num("epoch");
            ci.minSeq = c.optNum("min_seq").value_or(1);
            if (!c.error().isEmpty()) r.fail(QStringLiteral("convs: ") + c.error());
            cs.convs.append(ci);
        }
        cs.nextAfter = r.optStr("next_after");
        cs.hasMore = r.optBool("has_more");
        if (cs.hasMore && (cs.convs.isEmpty() || cs.nextAfter.isEmpty()))
            r.fail(QStringLiteral("convs: has_more without progress"));
        in.body = std::move(cs);
    } else if (t == u"fetched") {
        in.body = Fetched{readEvent(r.object("ev"), r)};
    } else if (t == u"subscribed") {
        in.body = Subscribed{};
    } else if (t == u"event") {
        in.body = EventPush{readEvent(r.object("ev"), r)};
    } else if (t == u"hint") {
        Hint h;
        h.conv = r.str("conv");
        h.head = r.num("head");
        h.epoch = r.optNum("epoch").value_or(0);
        h.read = r.optNum("read");
        in.body = h;
    } else if (t == u"resync") {
        in.body = Resync{};
    } else if (t == u"goaway") {
        Goaway g;
        g.reason = r.optStr("reason");
        g.retryMs = r.optNum("retry_ms");
        in.body = g;
    } else if (t == u"token_expiring") {
        in.body = TokenExpiring{r.num("exp")};
    } else if (t == u"refreshed") {
        in.body = Refreshed{r.num("exp")};
    } else if (t == u"typing_ok") {
        in.body = TypingOk{};
    } else if (t == u"typing") {
        TypingPush tp;
        tp.conv = r.str("conv");
        tp.user = r.str("user");
        tp.on = r.boolean("on");
        in.body = tp;
    } else if (t == u"presence") {
        // The reply carries `users` (a list), the push one `user`.
        if (o.contains(QStringLiteral("users"))) {
            PresenceReply pr;
            for (const QJsonValue &v : r.array("users")) {
                if (!v.isObject()) { r.fail(QStringLiteral("users: element is not an object")); break; }
                pr.users.append(readPresence(v.toObject(), r));
            }
            in.body = std::move(pr);
        } else {
            in.body = PresencePush{readPresence(o, r)};
        }
    } else if (t == u"error") {
        Error e;
        e.code = r.str("code");
        e.msg = r.optStr("msg");
        e.retryMs = r.optNum("retry_ms");
        in.body = e;
    } else {
        in.body = Unknown{t};
    }

    if (!r.error().isEmpty()) {
        if (error) *error = QStringLiteral("%1: %2").arg(t, r.error());
        return std::nullopt;
    }
    return in;
}

QByteArray encodeHello(const QString &rid, const QString &token, const QString &install) {
    QJsonObject o = request("hello", rid);
    o.insert(QStringLiteral("token"), token);
    o.insert(QStringLiteral("install"), install);
    return toFrame(o);
}

QByteArray encodeSend(const QString &rid, const QString &conv, const QString &cmid, const QString &body,
                      const QString &prev, qint64 replyTo, const QStringList &attachments) {
    QJsonObject o = request("send", rid);
    o.insert(QStringLiteral("conv"), conv);
    o.insert(QStringLiteral("cmid"), cmid);
    o.insert(QStringLiteral("body"), body);
    if (!prev.isEmpty())
        o.insert(QStringLiteral("prev"), prev);
    if (replyTo > 0)
        o.insert(QStringLiteral("reply_to"), replyTo);
    if (!attachments.isEmpty())
        o.insert(QStringLiteral("attachments"), QJsonArray::fromStringList(attachments));
    return toFrame(o);
}

QByteArray encodeEdit(const QString &rid, const QString &conv, qint64 target, const QString &cmid,
                      const QString &body) {
    QJsonObject o = request("edit", rid);
    o.insert(QStringLiteral("conv"), conv);
    o.insert(QStringLiteral("target"), target);
    o.insert(QStringLiteral("cmid"), cmid);
    o.insert(QStringLiteral("body"), body);
    return toFrame(o);
}

QByteArray encodeReact(const QString &rid, const QString &conv, qint64 target, const QString &cmid,
                       const QString &emoji, bool on) {
    QJsonObject o = request("react", rid);
    o.insert(QStringLiteral("conv"), conv);
    o.insert(QStringLiteral("target"), target);
    o.insert(QStringLiteral("cmid"), cmid);
    o.insert(QStringLiteral("emoji"), emoji);
    o.insert(QStringLiteral("on"), on);
    return toFrame(o);
}

QByteArray encodeSync(const QString &rid, const QString &conv, qint64 after, int limit,
                      std::optional<qint64> epoch) {
    QJsonObject o = request("sync", rid);
    o.insert(QStringLiteral("conv"), conv);
    o.insert(QStringLiteral("after"), after);
    if (limit > 0)
        o.insert(QStringLiteral("limit"), limit);
    if (epoch)
        o.insert(QStringLiteral("epoch"), *epoch);
    return toFrame(o);
}

QByteArray encodeAck(const QString &rid, const QString &conv, qint64 seq) {
    QJsonObject o = request("ack", rid);
    o.insert(QStringLiteral("conv"), conv);
    o.insert(QStringLiteral("seq"), seq);
    return toFrame(o);
}

QByteArray encodeRead(const QString &rid, const QString &conv, qint64 seq) {
    QJsonObject o = request("read", rid);
    o.insert(QStringLiteral("conv"), conv);
    o.insert(QStringLiteral("seq"), seq);
    return toFrame(o);
}

QByteArray encodeRecall(const QString &rid, const QString &conv, qint64 target, const QString &cmid) {
    QJsonObject o = request("recall", rid);
    o.insert(QStringLiteral("conv"), conv);
    o.insert(QStringLiteral("target"), target);
    o.insert(QStringLiteral("cmid"), cmid);
    return toFrame(o);
}

QByteArray encodeConvs(const QString &rid, const QString &after, int limit) {
    QJsonObject o = request("convs", rid);
    if (!after.isEmpty())
        o.insert(QStringLiteral("after"), after);
    if (limit > 0)
        o.insert(QStringLiteral("limit"), limit);
    return toFrame(o);
}

QByteArray encodeHistory(const QString &rid, const QString &conv, qint64 before, int limit,
                         std::optional<qint64> epoch) {
    QJsonObject o = request("history", rid);
    o.insert(QStringLiteral("conv"), conv);
    o.insert(QStringLiteral("before"), before);
    if (limit > 0)
        o.insert(QStringLiteral("limit"), limit);
    if (epoch)
        o.insert(QStringLiteral("epoch"), *epoch);
    return toFrame(o);
}

QByteArray encodeFetch(const QString &rid, const QString &conv, qint64 seq) {
    QJsonObject o = request("fetch", rid);
    o.insert(QStringLiteral("conv"), conv);
    o.insert(QStringLiteral("seq"), seq);
    return toFrame(o);
}

QByteArray encodeTyping(const QString &rid, const QString &conv, bool on) {
    QJsonObject o = request("typing", rid);
    o.insert(QStringLiteral("conv"), conv);
    o.insert(QStringLiteral("on"), on);
    return toFrame(o);
}

QByteArray encodePresence(const QString &rid, const QStringList &users) {
    QJsonObject o = request("presence", rid);
    o.insert(QStringLiteral("users"), QJsonArray::fromStringList(users));
    return toFrame(o);
}

QByteArray encodeSub(const QString &rid) { return toFrame(request("sub", rid)); }

QByteArray encodeRefresh(const QString &rid, const QString &token) {
    QJsonObject o = request("refresh", rid);
    o.insert(QStringLiteral("token"), token);
    return toFrame(o);
}

bool isJwt(const QString &token) {
    const QStringList parts = token.split(QLatin1Char('.'));
    if (parts.size() != 3 || parts[0].isEmpty() || parts[1].isEmpty())
        return false;
    for (const QString &part : parts)
        for (const QChar c : part)
            if (!(c.isLetterOrNumber() && c.unicode() < 128) && c != u'-' && c != u'_')
                return false;
    return true;
}

std::optional<qint64> jwtExpiryMs(const QString &token) {
    if (!isJwt(token))
        return std::nullopt;
    const auto payload = QByteArray::fromBase64Encoding(token.section(QLatin1Char('.'), 1, 1).toLatin1(),
                                                        QByteArray::Base64UrlEncoding | QByteArray::OmitTrailingEquals
                                                            | QByteArray::AbortOnBase64DecodingErrors);
    if (!payload)
        return std::nullopt;
    const QJsonValue exp = QJsonDocument::fromJson(*payload).object().value(QStringLiteral("exp"));
    if (!exp.isDouble() || !std::isfinite(exp.toDouble()) || exp.toDouble() <= 0 || exp.toDouble() > 1e11)
        return std::nullopt;
    return static_cast<qint64>(exp.toDouble() * 1000);
}

Disposition classify(const std::optional<Incoming> &reply) {
    if (!reply)
        return Disposition::Retry; // no reply: outcome unknown, the key makes a resend safe
    if (const auto *err = std::get_if<Error>(&reply->body)) {
        // Contract C6 and sdk.md obligation 2: UNAVAILABLE and RATE_LIMITED
        // (resent after its retry_ms: retryAfterMs) are the only retryable
        // codes. UNAUTHENTICATED and STALE_INSTALL judge the session, not
        // the request. Everything else, including MUTED and codes this SDK
        // version does not know, is terminal.
        if (err->code == u"UNAVAILABLE" || err->code == code::RateLimited)
            return Disposition::Retry;
        if (err->code == code::Unauthenticated || err->code == code::StaleInstall)
            return Disposition::EndSession;
        return Disposition::Terminal;
    }
    return Disposition::Success;
}

QString checkEmoji(const QString &emoji) {
    if (emoji.isEmpty() || !emoji.isValidUtf16())
        return QStringLiteral("the emoji must be 1-64 bytes of valid UTF-8");
    if (emoji.toUtf8().size() > 64)
        return QStringLiteral("the emoji is %1 bytes of UTF-8 (at most 64)").arg(emoji.toUtf8().size());
    for (const QChar c : emoji) {
        const char16_t u = c.unicode();
        if (u < 0x20 || (u >= 0x7f && u <= 0x9f))
            return QStringLiteral("the emoji contains a control character");
    }
    return {};
}

QString checkConv(const QString &conv) {
    if (conv.isEmpty() || conv.size() > 64)
        return QStringLiteral("conversation id must be 1-64 characters of [A-Za-z0-9._:-]");
    for (const QChar c : conv) {
        const char16_t u = c.unicode();
        const bool ok = (u >= u'a' && u <= u'z') || (u >= u'A' && u <= u'Z') || (u >= u'0' && u <= u'9')
                        || u == u'.' || u == u'_' || u == u':' || u == u'-';
        if (!ok)
            return QStringLiteral("conversation id must be 1-64 characters of [A-Za-z0-9._:-]");
    }
    return {};
}

QString checkSend(const QString &conv, const QString &body) {
    if (QString e = checkConv(conv); !e.isEmpty())
        return e;
    if (body.isEmpty())
        return QStringLiteral("the body is empty");
    if (!body.isValidUtf16())
        return QStringLiteral("the body is not valid Unicode (a lone surrogate)");
    if (body.contains(QChar(0)))
        return QStringLiteral("the body contains U+0000");
    qsizetype points = body.size();
    for (const QChar c : body)
        if (c.isHighSurrogate())
            --points; // a pair is one code point (isValidUtf16: every high one is paired)
    if (points > MaxBodyCodePoints)
        return QStringLiteral("the body has %1 code points (at most %2)").arg(points).arg(MaxBodyCodePoints);
    // The longest cmid, prev and rid the SDK uses; JSON escaping can grow the body.
    const QByteArray frame = encodeSend(QString(64, u'r'), conv, QString(36, u'c'), body, QString(36, u'p'));
    if (frame.size() > MaxFrameBytes)
        return QStringLiteral("the send frame would be %1 bytes (at most %2)").arg(frame.size()).arg(MaxFrameBytes);
    return {};
}

} // namespace im::proto
