// import ImSdk against the real server (run by tst_qml, see tst_qml.cpp for
// setupError, serverUrl, tokens and dataDir): a Client and the models made
// in QML, models bound to the client after construction, enums by name,
// roles by name (get() and delegates' required properties).
import QtQuick
import QtTest
import ImSdk

TestCase {
    id: test
    name: "ImSdkQml"
    width: 400
    height: 400

    Client { id: client }

    // Created without a client; the binding sets it after construction.
    ConversationListModel { id: convs; client: client }
    MessageListModel { id: msgs; client: client }
    OutboxModel { id: outbox; client: client }

    // A view's delegates see the roles by name.
    Repeater {
        id: view
        model: msgs
        delegate: Item {
            required property string body
            required property string cmid
            required property int messageState
            required property double seq
        }
    }

    SignalSpy { id: stateSpy; target: client; signalName: "messageStateChanged" }
    SignalSpy { id: errorSpy; target: client; signalName: "errorReported" }

    function rowOf(cmid) {
        for (let r = 0; r < msgs.count; ++r)
            if (msgs.get(r, "cmid") === cmid)
                return r
        return -1
    }

    function initTestCase() {
        verify(setupError === "", setupError)
    }

    function test_0_modelsWithoutClient() {
        // A model made in QML before any client is empty, not broken.
        const lone = Qt.createQmlObject("import ImSdk; MessageListModel { conversation: 'team' }", test)
        verify(lone.client === null)
        compare(lone.count, 0)
        compare(Object.keys(lone.get(0)).length, 0)
        lone.destroy()
        compare(convs.client, client)
        compare(msgs.client, client)
        compare(outbox.client, client)
    }

    // Obligation 14 in QML: the reason enum by name, the signal, the properties.
    SignalSpy { id: credentialsSpy; target: client; signalName: "credentialsNeeded" }
    function test_0_credentialsApi() {
        compare(Client.Expiring, 0)
        compare(Client.CredentialsReason.Rejected, 1)
        verify(credentialsSpy.valid)
        compare(client.awaitingCredentials, false)
        verify(isNaN(client.tokenExpiresAt.getTime()))  // unknown until a JWT or a push
    }

    function test_1_sendFromQml() {
        verify(client.open(dataDir + "/ana.db"), client.lastError())
        client.setServers([serverUrl])
        client.setCredentials(tokens["ana"])
        client.connectToServer()
        tryCompare(client, "connectionState", Im.Connected, 120000)
        compare(client.connectionState, Im.ConnectionState.Connected)
        compare(client.userId, "ana")

        // The demo data set gives ana "ana-ben" and "team".
        tryVerify(() => convs.indexOf("team") >= 0, 120000, "team never listed")
        const team = convs.indexOf("team")
        compare(convs.get(team).conv, "team")
        compare(convs.get(team, "kind"), "group")
        compare(convs.get(team, ConversationListModel.KindRole), "group")

        msgs.conversation = "team"
        const cmid = client.send("team", "hello from QML")
        verify(cmid !== "", client.lastError())
        tryVerify(() => rowOf(cmid) >= 0, 30000, "the message never showed")

        // Sent, with the seq the server gave it.
        tryVerify(() => { const r = rowOf(cmid); return r >= 0 && msgs.get(r, "messageState") === Im.MessageState.Sent },
                  120000, "the message never became Sent")
        const r = rowOf(cmid)
        const row = msgs.get(r)
        compare(row.messageState, Im.Sent)
        verify(row.state === undefined, "the role is messageState, not state (QML's Item.state)")
        compare(row.body, "hello from QML")
        compare(row.sender, "ana")
        compare(row.isOwn, true)
        verify(row.seq > 0, "no server seq: " + row.seq)
        compare(client.messageState(cmid), Im.MessageState.Sent)

        let signalled = 0
        for (let i = 0; i < stateSpy.count; ++i) {
            const a = stateSpy.signalArguments[i]
            if (a[1] === cmid && a[3] === Im.Sent)
                signalled = a[2]
        }
        compare(signalled, row.seq)

        // The delegate made for that row sees the same values by role name.
        tryVerify(() => view.count === msgs.count)
        const item = view.itemAt(r)
        compare(item.cmid, cmid)
        compare(item.body, "hello from QML")
        compare(item.messageState, Im.Sent)
        compare(item.state, "") // QML's own Item.state, untouched by the model
        compare(item.seq, row.seq)

        // The conversation's head reached it; the outbox is empty.
        tryVerify(() => convs.get(convs.indexOf("team"), "head") >= row.seq, 60000)
        tryCompare(outbox, "depth", 0, 60000)
        compare(client.pendingCount, 0)
    }

    // Contract section 12 from QML: reply, edit (by cmid and by seq), react,
    // and the roles they show (obligation 16, docs/sdk.md).
    function test_1b_changesFromQml() {
        msgs.conversation = "team"
        const q = client.send("team", "qml typo")
        verify(q !== "", client.lastError())
        verify(client.edit("team", q, "qml fixed") !== "", client.lastError())
        tryVerify(() => { const r = rowOf(q); return r >= 0 && msgs.get(r, "messageState") === Im.Sent }, 120000)
        const seq = msgs.get(rowOf(q), "seq")
        const a = client.reply("team", seq, "qml reply")
        verify(a !== "", client.lastError())
        verify(client.react("team", seq, "👍", true) !== "", client.lastError())
        tryVerify(() => client.pendingCount === 0, 120000, "changes never confirmed")
        tryVerify(() => { const r = rowOf(q); return r >= 0 && msgs.get(r, "body") === "qml fixed" && !msgs.get(r, "changePending") },
                  60000, "the edit never showed")
        const row = msgs.get(rowOf(q))
        compare(row.edited, true)
        tryVerify(() => msgs.get(rowOf(q), "reactions").length === 1, 60000, "the reaction never showed")
        const x = msgs.get(rowOf(q), "reactions")[0]
        compare(x.emoji, "👍")
        compare(x.count, 1)
        compare(x.mine, true)
        tryVerify(() => rowOf(a) >= 0 && msgs.get(rowOf(a), "quoteText") === "qml fixed", 60000, "no quote")
        compare(msgs.get(rowOf(a), "replyTo"), seq)
        compare(msgs.get(rowOf(a), "quoteSender"), "ana")
    }

    // Contract section 13 from QML (obligation 19): ben types in "ana-ben"
    // and ana's conversation model shows it by role name; a PresenceWatch
    // declared in QML follows ben online and offline.
    PresenceWatch { id: benWatch; client: client; users: ["ben"] }
    function test_1c_typingAndPresenceFromQml() {
        const ben = Qt.createQmlObject("import ImSdk; Client { }", test)
        verify(ben.open(dataDir + "/ben-qml.db"), ben.lastError())
        ben.setServers([serverUrl])
        ben.setCredentials(tokens["ben"])
        ben.connectToServer()
        tryCompare(ben, "connectionState", Im.Connected, 120000)
        tryCompare(benWatch, "online", true, 10000)
        compare(benWatch.onlineUsers, ["ben"])
        verify(benWatch.isOnline("ben"))
        verify(benWatch.known)

        tryVerify(() => convs.indexOf("ana-ben") >= 0, 60000)
        ben.setTyping("ana-ben", true)
        verify(ben.isTyping("ana-ben"))
        tryVerify(() => convs.get(convs.indexOf("ana-ben"), "typing").length === 1, 10000, "typing never showed")
        compare(convs.get(convs.indexOf("ana-ben")).typing[0], "ben")
        compare(client.typingUsers("ana-ben"), ["ben"])
        ben.setTyping("ana-ben", false)
        tryVerify(() => convs.get(convs.indexOf("ana-ben"), "typing").length === 0, 10000, "typing never stopped")

        ben.disconnectFromServer()
        tryCompare(benWatch, "online", false, 10000)
        verify(!isNaN(benWatch.lastSeen.getTime()), "no last seen")
        verify(!isNaN(benWatch.lastSeenOf("ben").getTime()))
        ben.close()
        ben.destroy()
    }

    // Obligation 18 from QML: a SearchModel over the events the real
    // server sent, edits applied (test_1b edited "qml typo" to "qml fixed").
    SearchModel { id: found; client: client }
    function test_1d_searchFromQml() {
        found.query = "QML fix"
        tryVerify(() => !found.searching && found.count >= 1, 30000, "nothing found")
        compare(found.get(0).body, "qml fixed")
        compare(found.get(0).conv, "team")
        compare(found.get(0).matches.length, 2)
        compare(found.get(0).matches[1].start, 4)
        compare(found.get(0).matches[1].length, 3)
        found.query = "typo"
        tryVerify(() => !found.searching, 30000)
        compare(found.count, 0)
    }

    function test_2_typedErrors() {
        // A body the server would refuse: refused at once, typed by name.
        errorSpy.clear()
        compare(client.send("team", ""), "")
        compare(errorSpy.count, 1)
        compare(errorSpy.signalArguments[0][0], Im.Error.InvalidArgument)
        compare(errorSpy.signalArguments[0][1], "INVALID_ARGUMENT")
    }

    function test_3_clientSwitch() {
        // Moving a model to another client shows that client's database.
        const other = Qt.createQmlObject("import ImSdk; Client { }", test)
        verify(other.open(dataDir + "/empty.db"), other.lastError())
        const m = Qt.createQmlObject("import ImSdk; MessageListModel { conversation: 'team' }", test)
        m.client = client
        tryVerify(() => m.count > 0)
        m.client = other
        compare(m.count, 0)
        m.client = client
        tryVerify(() => m.count > 0)
        m.destroy()

        // The outbox model too: `other` never connects, its message waits.
        const o = Qt.createQmlObject("import ImSdk; OutboxModel { }", test)
        compare(o.depth, 0)
        verify(other.send("team", "waits in other's outbox") !== "")
        o.client = other
        compare(o.depth, 1)
        compare(o.get(0).body, "waits in other's outbox")
        compare(o.get(0, "conv"), "team")
        o.client = client
        compare(o.depth, 0)
        o.client = other
        compare(o.depth, 1)
        other.destroy()
        tryVerify(() => o.client === null)
        compare(o.depth, 0)
        o.destroy()
    }

    // Issue 26 item 9: outbox() and the settings from QML.
    SignalSpy { id: settingsSpy; signalName: "settingsChanged" }
    function test_4_outboxAndSettings() {
        const c = Qt.createQmlObject(
            "import ImSdk; Client { sendWindow: 3; pingInterval: 4000; silenceTimeout: 9000 }", test)
        // Declared in QML, read back from the C++ side's values.
        compare(c.sendWindow, 3)
        compare(c.pingInterval, 4000)
        compare(c.silenceTimeout, 9000)
        settingsSpy.target = c
        c.sendWindow = 5
        compare(c.sendWindow, 5)
        compare(settingsSpy.count, 1)
        c.setKeepAlive(2000, 1000)           // silence is never below the ping interval
        compare(c.pingInterval, 2000)
        compare(c.silenceTimeout, 2000)
        c.setReconnectBackoff(100, 1000)      // the other setters are callable too
        c.setRetryBackoff(100, 1000)

        // TLS trust: a file without a certificate is refused, the setting kept.
        compare(c.trustedCaFile, "")
        verify(!c.setTrustedCaFile(dataDir + "/no-such.pem"))
        compare(c.trustedCaFile, "")
        errorSpy.target = c
        errorSpy.clear()
        c.pinnedCertificateSha256 = "not hex"
        compare(c.pinnedCertificateSha256, "")
        compare(errorSpy.count, 1)
        compare(errorSpy.signalArguments[0][0], Im.Error.InvalidArgument)
        const pin = "AB:".repeat(31) + "AB"
        c.pinnedCertificateSha256 = pin
        compare(c.pinnedCertificateSha256, pin)
        errorSpy.target = client

        // outbox(): the entries as values, in creation order.
        verify(c.open(dataDir + "/settings.db"), c.lastError())
        compare(c.outbox().length, 0)
        const first = c.send("team", "first draft")
        const second = c.send("team", "second draft")
        const entries = c.outbox()
        compare(entries.length, 2)
        compare(entries[0].cmid, first)
        compare(entries[0].body, "first draft")
        compare(entries[0].conv, "team")
        compare(entries[0].kind, "send")
        compare(entries[1].cmid, second)
        compare(entries[1].attempts, 0)
        c.close()
        c.destroy()
    }

    // Obligation 17 from QML (demo50): sendFile, the throttle as a property,
    // and the file roles by name: `attachments` (name, size, sha256; after
    // Sent the server's id, and a download's state and path) and
    // `uploadProgress` (0..1 while the upload runs, -1 once Sent), through
    // get() and a delegate's required properties.
    MessageListModel { id: files; client: client; conversation: "ana-ben" }
    Repeater {
        id: fileView
        model: files
        delegate: Item {
            required property string cmid
            required property var attachments
            required property double uploadProgress
        }
    }
    SignalSpy { id: uploadSpy; target: client; signalName: "uploadProgress" }
    function fileRow(cmid) {
        for (let r = 0; r < files.count; ++r)
            if (files.get(r, "cmid") === cmid)
                return r
        return -1
    }
    function test_5_fileRolesFromQml() {
        compare(client.connectionState, Im.Connected)
        client.uploadRateLimit = 512 * 1024 // about 3 s for 1.5 MiB: the upload can be watched
        compare(client.uploadRateLimit, 524288)
        uploadSpy.clear()
        const cmid = client.sendFile("ana-ben", fileToSend, "a file from QML")
        verify(cmid !== "", client.lastError())
        tryVerify(() => fileRow(cmid) >= 0, 30000, "the file's message never showed")
        const mine = files.get(fileRow(cmid))
        compare(mine.messageState, Im.Pending)
        compare(mine.body, "a file from QML")
        compare(mine.attachments.length, 1)
        compare(mine.attachments[0].name, "qml-file.bin")
        compare(mine.attachments[0].size, fileSize)
        compare(mine.attachments[0].sha256, fileSha256)
        verify(mine.uploadProgress >= 0 && mine.uploadProgress < 1, "uploadProgress " + mine.uploadProgress)
        // Part of the way, by role name through get() and in a delegate.
        tryVerify(() => { const p = files.get(fileRow(cmid), "uploadProgress"); return p > 0 && p < 1 }, 60000,
                  "no upload progress between 0 and 1 seen")
        tryVerify(() => fileView.count === files.count)
        const item = fileView.itemAt(fileRow(cmid))
        compare(item.cmid, cmid)
        compare(item.attachments.length, 1)
        compare(item.attachments[0].name, "qml-file.bin")
        verify(item.uploadProgress > 0, "the delegate's uploadProgress " + item.uploadProgress)
        // Sent: no upload any more (-1), the file keeps its place with the server's id.
        tryVerify(() => files.get(fileRow(cmid), "messageState") === Im.Sent, 120000, "the file never became Sent")
        const r = fileRow(cmid)
        verify(files.get(r, "seq") > 0)
        compare(files.get(r, "uploadProgress"), -1)
        const att = files.get(r, "attachments")[0]
        verify(att.id !== "", "no attachment id after Sent")
        compare(att.name, "qml-file.bin")
        compare(att.size, fileSize)
        compare(att.downloadState, "")
        verify(uploadSpy.count > 1)
        const last = uploadSpy.signalArguments[uploadSpy.count - 1]
        compare(last[0], cmid)
        compare(last[1], fileSize)
        compare(last[2], fileSize)
        // A download shows in the attachments role: done, at its path.
        const out = dataDir + "/qml-file.out"
        compare(client.download(att.id, out), att.id)
        tryVerify(() => files.get(fileRow(cmid), "attachments")[0].downloadState === "done", 60000, "never downloaded")
        compare(files.get(fileRow(cmid), "attachments")[0].path, out)
        tryVerify(() => fileView.itemAt(fileRow(cmid)).attachments[0].downloadState === "done")
        client.uploadRateLimit = 0
    }

    function cleanupTestCase() {
        client.disconnectFromServer()
        client.close()
    }
}
