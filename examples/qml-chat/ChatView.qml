// Sign in, the conversation list, one conversation's messages and a send
// box: all on `import ImSdk`, no C++ glue.
import QtQuick
import QtQuick.Controls
import QtQuick.Layouts
import ImSdk

Item {
    id: view

    property string serverUrl
    property string token
    property var users: []   // from a demo token file: [{user, device, token}]
    property string user     // preselected entry of `users`
    property string dataDir
    property string status
    property bool opened: false  // signIn() opened the local database
    readonly property alias client: client
    readonly property alias conversations: conversations
    readonly property alias messages: messages
    readonly property bool signedIn: opened

    Client {
        id: client
        onErrorOccurred: (code, message) => view.status = code + ": " + message
    }
    ConversationListModel { id: conversations; client: client }
    MessageListModel { id: messages; client: client }

    function tokenFor(name) {
        for (const u of view.users)
            if (u.user === name || u.device === name)
                return u.token
        return ""
    }

    /// Opens the local database of the signed-in user and connects. One
    /// store per user (obligation 10, docs/sdk.md "Quick start"): named
    /// after the server and the user the sign-in chose (a user of the token
    /// file), or after the token when the user is not known (a bare device
    /// token is one user's: its store never sees another). Never one store
    /// for whoever signs in. Returns false with view.status set.
    function signIn(url, deviceToken, userName) {
        if (url === "" || deviceToken === "") {
            view.status = "a server URL and a token are needed"
            return false
        }
        const who = userName ? "user " + userName : "token " + deviceToken
        const db = view.dataDir + "/" + Qt.md5(url + " " + who) + ".db"
        client.setCredentials(deviceToken)
        if (!client.open(db)) {
            view.status = client.lastError()
            return false
        }
        client.setServers([url])
        client.connectToServer()
        view.opened = true
        view.status = ""
        return true
    }

    /// Sends `text` to the open conversation; returns the cmid ("" if refused).
    function send(text) {
        if (messages.conversation === "" || text === "")
            return ""
        return client.send(messages.conversation, text)
    }

    // --- sign in -------------------------------------------------------------
    ColumnLayout {
        visible: !view.signedIn
        anchors.centerIn: parent
        width: Math.min(parent.width - 40, 420)
        spacing: 8

        Label { text: "Sign in"; font.pixelSize: 20 }
        TextField {
            id: urlField
            objectName: "urlField"
            Layout.fillWidth: true
            placeholderText: "ws://HOST:PORT/v1/ws"
            text: view.serverUrl
        }
        ComboBox {
            id: userBox
            objectName: "userBox"
            Layout.fillWidth: true
            visible: view.users.length > 0
            model: view.users.map(u => u.user)
            Component.onCompleted: currentIndex = Math.max(0, find(view.user))
        }
        TextField {
            id: tokenField
            objectName: "tokenField"
            Layout.fillWidth: true
            visible: view.users.length === 0
            placeholderText: "device token"
            echoMode: TextInput.Password
            text: view.token
        }
        Button {
            objectName: "signInButton"
            text: "Sign in"
            onClicked: view.users.length > 0
                       ? view.signIn(urlField.text, view.tokenFor(userBox.currentText), userBox.currentText)
                       : view.signIn(urlField.text, tokenField.text, "")
        }
        Label { text: view.status; color: "firebrick"; wrapMode: Text.Wrap; Layout.fillWidth: true }
    }

    // --- chat ----------------------------------------------------------------
    RowLayout {
        visible: view.signedIn
        anchors.fill: parent
        anchors.margins: 8
        spacing: 8

        ListView {
            id: convList
            objectName: "conversationList"
            Layout.preferredWidth: 200
            Layout.fillHeight: true
            clip: true
            model: conversations
            delegate: ItemDelegate {
                required property string conv
                required property double unread
                width: ListView.view.width
                text: unread > 0 ? conv + " (" + unread + ")" : conv
                highlighted: messages.conversation === conv
                onClicked: messages.conversation = conv
            }
        }

        ColumnLayout {
            Layout.fillWidth: true
            Layout.fillHeight: true

            Label {
                text: (messages.conversation || "pick a conversation") + "  ·  "
                      + ["disconnected", "connecting", "connected", "reconnecting"][client.connectionState]
                font.bold: true
            }
            ListView {
                id: messageList
                objectName: "messageList"
                Layout.fillWidth: true
                Layout.fillHeight: true
                clip: true
                model: messages
                // The model is newest first (row 0 = newest); laid out bottom
                // to top, row 0 sits at the bottom, as in every chat. The view
                // itself calls fetchMore() when its end (the top, the oldest
                // row) comes into sight: older messages load on scroll up,
                // and a view kept at the newest message never pulls history
                // (docs/sdk.md, "Timelines in views", obligation 15).
                verticalLayoutDirection: ListView.BottomToTop
                // Follow new messages while at the newest one, and keep the
                // model's window at its size there: a DelegateModel calls
                // fetchMore() by itself (when the list is made, and as rows
                // change), which the model takes for a user reading older
                // rows (docs/sdk.md, "Windows that stay small").
                // Back at the newest message after reading older ones, the
                // window shrinks to its size with the next change of rows.
                // (Not on atYEnd's own change: it also turns true for a
                // moment while older rows are laid out above.)
                onCountChanged: if (atYEnd) { positionViewAtBeginning(); messages.followNewest() }
                delegate: Label {
                    required property string kind
                    required property string sender
                    required property string body
                    required property int messageState
                    required property string errorCode
                    required property bool held
                    width: ListView.view.width
                    wrapMode: Text.Wrap
                    text: kind === "gap" ? "… older messages not loaded …"
                        : kind !== "msg" ? "· " + kind
                        : sender + ": " + body
                          + (held ? "  (held: written under another user's token, never sent)"
                             : messageState === Im.Pending ? "  (sending…)"
                             : messageState === Im.Failed || messageState === Im.Expired ? "  (not sent: " + errorCode + ")"
                             : messageState === Im.Recalled ? "  (recalled)" : "")
                    opacity: messageState === Im.Pending ? 0.6 : 1
                }
            }
            RowLayout {
                Layout.fillWidth: true
                TextField {
                    id: input
                    objectName: "input"
                    Layout.fillWidth: true
                    placeholderText: "message"
                    enabled: messages.conversation !== ""
                    onAccepted: sendButton.clicked()
                }
                Button {
                    id: sendButton
                    objectName: "sendButton"
                    text: "Send"
                    enabled: input.text !== "" && messages.conversation !== ""
                    onClicked: if (view.send(input.text) !== "") input.clear()
                }
            }
            Label { text: view.status; color: "firebrick"; visible: text !== "" }
        }
    }
}
